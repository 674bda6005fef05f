// y = x·wᵀ over a weight kept in quantized groups, as a GGUF's Q4_K, Q5_K, Q6_K and per-32
// blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) hold it.
// Q4_K, Q5_K and the byte form: each group of 32 inputs of an output row is `scale · u − min`
// with u unsigned (4 bits, 5, or 8), scale = d · sc and min = dmin · m, d and dmin fp32 per 256
// inputs of the row, sc and m one byte each per group (the 6-bit codes as the file has them).
// Q6_K: each 16 inputs are `scale · (u − 32)`, u in 6 bits, scale = d · sc with sc a signed byte.
//
// Layout, panels of 16 output rows as the other linears' (small_linear.cpp), per panel p and
// group g of 32 inputs:
//   values: Q4_K: nibbles [P][G][4][16][4], 64 bytes for 4 inputs of 16 outputs in their low
//           nibbles (inputs 32g + 4v + 0..3) and 4 more in their high ones (32g + 16 + 4v + 0..3);
//           Q5_K: those and a plane of fifth bits, as the per-32 Q5 types' below;
//           Q6_K: the same nibbles (u's low four bits) then [2][16][4] bytes of u's top two bits,
//           input 32g + 16h + 4v + b's in bits 2v, 2v + 1 of byte [h][o][b] ([P][G][6][16][4]);
//           bytes: [P][G][8][16][4], 64 bytes for inputs 32g + 4v + 0..3 of 16 outputs;
//   codes:  [P][G][2][16] uint8, the group's sc then m of the 16 outputs (Q6_K: the two
//           halves' sc, int8);
//   supers: [P][K/256][2][16] fp32, d then dmin of the 16 outputs (Q6_K: d, then zeros).
// Q4_K is then 4.75 bits a value (the file's 4.5, its fp16 d and dmin widened to fp32), Q6_K
// 6.75 (the file's 6.56), the byte form 8.75.
//
// The per-32 types (`FlatWeight`): each group of 32 inputs is `d · (u − offset) + m`, d and m
// fp16 of the group's own (m in the `_1` types only; offset 8 for Q4_0, 16 for Q5_0, 128 for
// Q8_0 stored as u = q + 128, 0 for the `_1` types), with no super-blocks, so K is any multiple
// of 32 (the 0.5B coder's 896, SmolLM2's 576):
//   values:  Q4_0, Q4_1: the nibbles as Q4_K's; Q5_0, Q5_1: those and one plane [16][4] of
//            fifth bits, input 32g + 4v + b's in bit v of byte [o][b], input 32g + 16 + 4v + b's
//            in bit 4 + v; Q8_0: the bytes as the byte form's ([P][G][4, 5 or 8][16][4]);
//   factors: [P][G][1 or 2][16] fp16, d then m of the 16 outputs.
// That is the file's own size: 4.5, 5, 5.5, 6 and 8.5 bits a value. The fp16 factors are widened
// in registers (vcvtph2ps: one instruction for 16); keeping them fp32 would read 0.5-1 bit a
// value more for nothing, since every fp16 is exact in fp32.
//
// x is quantized to int8 per row as it comes in, and VNNI's byte dot product (vpdpbusd: the
// weight's unsigned values against x's signed ones, 64 multiply-adds an instruction) gives the
// exact integer Σ u·q of a group for 16 outputs.
//
// For the K-quants x takes one step per super-block of 256 inputs, as llama.cpp's Q8_K does, so
// that a group's dot needs no factor of x's own: s = the super-block's largest |x| / 127 / 8,
// and each group's q = round(x / (s · 2^shift)), its step halved (shift lowered from 3) while
// its values still fit in ±127, so a group of small values keeps up to 8x the resolution of one
// step for the whole super-block. Per group and row
//     part += (Σ u·q · 2^shift) · scale        (an integer shift, then one FMA)
// and per super-block
//     part −= dmin · Σ m · (Σq · 2^shift)      (int16 pairs: a vpdpwssd per two groups)
//     y += part · s
// The multiply units do the dots and the FMAs alike (an FMA costs the time of a vpdpbusd on Zen
// 4), so a group's 8 dots per row carry 1 FMA more, where a step per group of x carried 3 (the
// scale times s, the FMA, the min's): 1.07-1.12x at prefill's row counts, measured. Its logits
// move 1.97% of their spread from the dequantized model on the 1.5B coder, against 1.75% with a
// step per group of 32 and 3.01% with one per super-block alone (llama.cpp's). Q6_K takes each
// half's Σ (u − 32)·q = Σ u·q − 32·Σq exactly (the dot starts from −32·Σq), shifted and times
// its scale, a half at a time (both halves' dots at once spill registers at 8 rows: 0.8x).
// Everything runs group after group in the same order whatever the row count, so a row alone
// and in a batch give the same bits. The values are unpacked in registers (an and, a shift;
// Q6_K's top bits shifted and merged) once per pass over the panel for up to `kMaxRows` rows.
//
// One 8960×1536 matrix, ms a call, one thread's CPU time on the 2-vCPU Zen 4 (busy; weights from
// memory; `benchmarks/group_kernel.py --cpu-time`; before x's step per super-block):
//
//     rows                       1      4      16     64     128    512
//     bf16 panels                1.47   2.20   4.79   11.95  22.52  71.32 (oneDNN)
//     int8 rows (small_linear)   0.87   1.18   2.57   6.03   10.51  41.54
//     Q4_K (this kernel)         0.45   0.61   1.62   5.94   11.70  47.74
//     Q6_K (this kernel)         0.66   0.80   2.02   7.34   14.44  56.58
//
// Up to 16 rows the bytes read bound it; from 64 the arithmetic does.
//
// The per-32 types keep a step per group of 32 for x (q = round(x · 127 / the group's largest
// |x|), s that largest / 127, as small_linear.cpp's int8 path): their d is per group anyway.
// They take each group's Σ (u − offset)·q exactly (the dot starts from −offset·Σq)
// and add it times d · s, then (the `_1` types) m · (s · Σq): the byte form's arithmetic with
// an fp16 conversion of d (and m) per group in place of its codes' two. Q5's fifth bits are
// shifted to bit 4 and merged into the nibbles as Q6_K's top bits are. The 0.5B coder's fused
// gate-up, 9728×896, the same measure (load 8-10):
//
//     rows                       1      4      16     64     512
//     bf16 panels                0.81   1.16   2.90   7.72   46.43 (oneDNN)
//     int8 rows (small_linear)   0.36   0.38   1.37   3.76   26.55
//     Q4_0                       0.21   0.28   0.92   3.44   27.53
//     Q4_1                       0.24   0.29   1.02   3.77   30.18
//     Q5_0                       0.29   0.33   1.02   3.80   30.33
//     Q8_0                       0.47   0.59   1.30   3.89   28.46
//
// Q8_0 reads 6% more than int8 rows (a d per group); fetching ahead at one row as well made it
// slower still (the LM head's 151936×896: 7.7 against 5.9 ms).
#include <ATen/Parallel.h>

#include <algorithm>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels.h"

namespace semantic {
namespace {

constexpr int64_t kPanel = 16;   // output rows per panel
constexpr int64_t kGroup = 32;   // inputs per scale and min, of the weight and of x
constexpr int64_t kGroupsPerSuper = kBlockSuper / kGroup;
constexpr int64_t kMaxRows = 8;  // x rows per pass: their accumulators and dots stay in registers
constexpr int64_t kPrefetchGroups = 8;  // how far ahead the values are fetched

// The largest |x| of a group of 32.
inline float group_largest(const bf16* group) {
  return std::max(_mm512_reduce_max_ps(_mm512_abs_ps(load_bf16x16(group))),
                  _mm512_reduce_max_ps(_mm512_abs_ps(load_bf16x16(group + 16))));
}

// A group of 32 to int8, q = round(x · inv) (to nearest even, as torch.round; the caller's inv
// keeps |q| ≤ 127), into `out`; returns each half's Σq.
inline std::pair<int32_t, int32_t> quantize_group_to(const bf16* group, float inv, int8_t* out) {
  const __m512 by = _mm512_set1_ps(inv);
  const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(load_bf16x16(group), by));
  const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(load_bf16x16(group + 16), by));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8(q0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), _mm512_cvtepi32_epi8(q1));
  return {_mm512_reduce_add_epi32(q0), _mm512_reduce_add_epi32(q1)};
}

// x's rows quantized per group of 32, for the per-32 blocks (see the top of the file).
struct GroupQuantizedRows {
  int64_t groups;
  std::vector<int8_t> q;     // [M][K]
  std::vector<float> scale;  // [M][groups]: the group's largest |x| / 127 (0 for all zeros)
  std::vector<float> sum;    // [M][groups]: scale · Σq, what the `_1` types' m multiplies
  std::vector<int32_t> qsum;  // [M][groups]: Σq, what a per-32 block's offset multiplies

  GroupQuantizedRows(const bf16* x, int64_t ldx, int64_t m, int64_t k)
      : groups(k / kGroup),
        q(m * k),
        scale(m * groups),
        sum(m * groups),
        qsum(m * groups) {
    // split among the threads only when there are rows enough to pay for it (prefill)
    at::parallel_for(0, m, 16, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        for (int64_t g = 0; g < groups; ++g) quantize_group(x + r * ldx, r, g);
      }
    });
  }

  void quantize_group(const bf16* row, int64_t r, int64_t g) {
    const float amax = group_largest(row + g * kGroup);
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    const auto [sum0, sum1] =
        quantize_group_to(row + g * kGroup, inv, q.data() + (r * groups + g) * kGroup);
    const float s = amax / 127.0f;
    scale[r * groups + g] = s;
    sum[r * groups + g] = s * static_cast<float>(sum0 + sum1);
    qsum[r * groups + g] = sum0 + sum1;
  }

  const int8_t* row_group(int64_t r, int64_t g) const {
    return q.data() + (r * groups + g) * kGroup;
  }
};

// How many times a group's step may halve the super-block's: 2^3 · Σq and 2^3 · Σu·q stay
// within an int16 and an fp32's exact integers.
constexpr int kFinest = 3;

// x's rows quantized for the K-quants (see the top of the file): a step per super-block of 256
// inputs, halved up to kFinest times for a group whose values are that much smaller.
struct SuperQuantizedRows {
  int64_t groups, supers;
  std::vector<int8_t> q;           // [M][K]
  std::vector<float> step;         // [M][supers]: the super-block's largest |x| / 127 / 2^kFinest
  std::vector<int32_t> shift;      // [M][groups]: kFinest − the times the group's step halved
  std::vector<int32_t> offset;     // [M][groups][2]: −32·Σq of each half, where Q6_K's dots start
  std::vector<int32_t> sum_pairs;  // [M][groups / 2]: Σq · 2^shift of groups 2j, 2j + 1, int16s

  SuperQuantizedRows(const bf16* x, int64_t ldx, int64_t m, int64_t k)
      : groups(k / kGroup),
        supers(k / kBlockSuper),
        q(m * k),
        step(m * supers),
        shift(m * groups),
        offset(2 * m * groups),
        sum_pairs(m * groups / 2) {
    at::parallel_for(0, m, 16, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        for (int64_t s = 0; s < supers; ++s) quantize_super(x + r * ldx, r, s);
      }
    });
  }

  void quantize_super(const bf16* row, int64_t r, int64_t s) {
    float amax[kGroupsPerSuper];
    float largest = 0.0f;
    for (int64_t j = 0; j < kGroupsPerSuper; ++j) {
      amax[j] = group_largest(row + (s * kGroupsPerSuper + j) * kGroup);
      largest = std::max(largest, amax[j]);
    }
    const float unit = largest > 0.0f ? 127.0f / largest : 0.0f;
    step[r * supers + s] = largest / 127.0f / static_cast<float>(1 << kFinest);
    int32_t sums[kGroupsPerSuper];
    for (int64_t j = 0; j < kGroupsPerSuper; ++j) {
      const int64_t g = s * kGroupsPerSuper + j;
      int halved = 0;
      while (halved < kFinest && amax[j] * static_cast<float>(2 << halved) <= largest) ++halved;
      // the unit times an exact power of two: |q| ≤ 127 while the group fits
      const auto [sum0, sum1] =
          quantize_group_to(row + g * kGroup, unit * static_cast<float>(1 << halved),
                            q.data() + (r * groups + g) * kGroup);
      shift[r * groups + g] = kFinest - halved;
      offset[2 * (r * groups + g)] = -32 * sum0;
      offset[2 * (r * groups + g) + 1] = -32 * sum1;
      sums[j] = (sum0 + sum1) * (1 << (kFinest - halved));
    }
    for (int64_t j = 0; j < kGroupsPerSuper; j += 2) {
      sum_pairs[(r * groups + s * kGroupsPerSuper + j) / 2] =
          static_cast<int32_t>((static_cast<uint32_t>(sums[j + 1]) << 16) |
                               (static_cast<uint32_t>(sums[j]) & 0xFFFFu));
    }
  }

  const int8_t* row_group(int64_t r, int64_t g) const {
    return q.data() + (r * groups + g) * kGroup;
  }
};

// Q4_K (and Q4_0, Q4_1), Q6_K, the byte form (and Q8_0), Q5_0 and Q5_1
enum class Form { kNibbles, kSix, kBytes, kFive };

constexpr int planes_of(Form f) {
  return f == Form::kNibbles ? 4 : f == Form::kSix ? 6 : f == Form::kFive ? 5 : 8;
}

// 16 group codes (bytes, signed for Q6_K) times a per-output factor: a group's scales or mins.
template <bool kSigned = false>
inline __m512 group_factor(const uint8_t* codes, __m512 factor) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes));
  const __m512i wide = kSigned ? _mm512_cvtepi8_epi32(raw) : _mm512_cvtepu8_epi32(raw);
  return _mm512_mul_ps(factor, _mm512_cvtepi32_ps(wide));
}

// Q6_K's top two bits of inputs 4v + 0..3 of a half, from its byte of pairs, at bits 4 and 5.
template <int V>
inline __m512i top_bits(__m512i pairs) {
  const __m512i shifted = V < 2 ? _mm512_slli_epi16(pairs, 4 - 2 * V)
                                : (V == 2 ? pairs : _mm512_srli_epi16(pairs, 2 * V - 4));
  return _mm512_and_si512(shifted, _mm512_set1_epi8(0x30));
}

// (low & 0x0F) | top: the nibble and the two top bits (already at bits 4 and 5 alone).
inline __m512i merged(__m512i low, __m512i top) {
  return _mm512_ternarylogic_epi32(low, top, _mm512_set1_epi8(0x0F), 0xE4);  // c ? a : b
}

template <int H, int V, int MT>
inline void six_step(const int8_t* const* q, const uint8_t* w, __m512i pairs, __m512i* dot) {
  const __m512i raw = _mm512_loadu_si512(w + V * 4 * kPanel);
  const __m512i value = merged(H == 0 ? raw : _mm512_srli_epi16(raw, 4), top_bits<V>(pairs));
#pragma GCC unroll 8
  for (int i = 0; i < MT; ++i) {
    dot[i] = dot_broadcast(dot[i], value, q[i] + 4 * V);
  }
}

// Σ (u − 32)·q of half H of a group (inputs 16H .. 16H + 15) for 16 outputs and MT rows of x:
// the dot starts from −32·Σq, exact. A half at a time, so that one dot a row is live.
template <int H, int MT>
inline void six_half(const SuperQuantizedRows& x, int64_t m0, int64_t g, const uint8_t* w,
                     __m512i* dot) {
  const __m512i pairs = _mm512_loadu_si512(w + (4 + H) * 4 * kPanel);
  const int8_t* q[MT];
#pragma GCC unroll 8
  for (int i = 0; i < MT; ++i) {
    q[i] = x.row_group(m0 + i, g) + 16 * H;
    dot[i] = _mm512_set1_epi32(x.offset[2 * ((m0 + i) * x.groups + g) + H]);
  }
  six_step<H, 0, MT>(q, w, pairs, dot);
  six_step<H, 1, MT>(q, w, pairs, dot);
  six_step<H, 2, MT>(q, w, pairs, dot);
  six_step<H, 3, MT>(q, w, pairs, dot);
}

// Q5's fifth bits of inputs 4v + 0..3 (low) and 16 + 4v + 0..3 (high) of a group, from their
// byte (bits v and 4 + v), at bit 4 alone: a 16-bit shift never brings the other byte's bits to
// bit 4 of this one.
template <int V>
inline __m512i fifth_low(__m512i bits) {
  return _mm512_and_si512(_mm512_slli_epi16(bits, 4 - V), _mm512_set1_epi8(0x10));
}
template <int V>
inline __m512i fifth_high(__m512i bits) {
  return _mm512_and_si512(_mm512_srli_epi16(bits, V), _mm512_set1_epi8(0x10));
}

template <int V, int MT>
inline void five_step(const int8_t* const* q, const uint8_t* w, __m512i bits, __m512i* dot) {
  const __m512i raw = _mm512_loadu_si512(w + V * 4 * kPanel);
  const __m512i lo = merged(raw, fifth_low<V>(bits));
  const __m512i hi = merged(_mm512_srli_epi16(raw, 4), fifth_high<V>(bits));
#pragma GCC unroll 8
  for (int i = 0; i < MT; ++i) {
    dot[i] = dot_broadcast(dot[i], lo, q[i] + 4 * V);
    dot[i] = dot_broadcast(dot[i], hi, q[i] + 16 + 4 * V);
  }
}

// Σ (u − offset)·q of one group for 16 outputs and MT rows of x (from m0): exact integers.
template <Form F, int MT, typename Rows>
inline void group_dots(const Rows& x, int64_t m0, int64_t g, const uint8_t* w, __m512i* dot,
                       int32_t offset = 0) {
  const int8_t* q[MT];
#pragma GCC unroll 8
  for (int i = 0; i < MT; ++i) {
    q[i] = x.row_group(m0 + i, g);
    if constexpr (std::is_same_v<Rows, GroupQuantizedRows>) {
      // −offset·Σq: a per-32 block's Σ (u − offset)·q
      dot[i] = _mm512_set1_epi32(-offset * x.qsum[(m0 + i) * x.groups + g]);
    } else {
      dot[i] = _mm512_setzero_si512();
    }
  }
  if constexpr (F == Form::kFive) {
    const __m512i bits = _mm512_loadu_si512(w + 4 * 4 * kPanel);
    five_step<0, MT>(q, w, bits, dot);
    five_step<1, MT>(q, w, bits, dot);
    five_step<2, MT>(q, w, bits, dot);
    five_step<3, MT>(q, w, bits, dot);
  } else if constexpr (F == Form::kNibbles) {
    const __m512i low = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      const __m512i raw = _mm512_loadu_si512(w + v * 4 * kPanel);
      const __m512i lo = _mm512_and_si512(raw, low);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i) {
        dot[i] = dot_broadcast(dot[i], lo, q[i] + 4 * v);
        dot[i] = dot_broadcast(dot[i], hi, q[i] + 16 + 4 * v);
      }
    }
  } else {
#pragma GCC unroll 8
    for (int v = 0; v < 8; ++v) {
      const __m512i raw = _mm512_loadu_si512(w + v * 4 * kPanel);
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i) dot[i] = dot_broadcast(dot[i], raw, q[i] + 4 * v);
    }
  }
}

// The values a few groups on, asked for now: with a few rows to compute, the prefetchers alone
// leave Q6_K's six planes late (2x slower at 4 rows); one row reads at the memory's rate without
// (and loses a little with).
template <Form F, int MT>
inline void fetch_ahead(const uint8_t* group) {
  if constexpr (MT > 1) {
    constexpr int64_t kGroupBytes = planes_of(F) * 4 * kPanel;
    const uint8_t* ahead = group + kPrefetchGroups * kGroupBytes;
#pragma GCC unroll 8
    for (int64_t line = 0; line < kGroupBytes; line += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(ahead + line), _MM_HINT_T0);
    }
  }
}

// Groups 2j and 2j + 1's min codes of 16 outputs as int16 pairs: what Σq's pairs multiply.
inline __m512i min_pair(const uint8_t* codes, int64_t g) {
  const __m512i first = _mm512_cvtepu8_epi32(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + g * 2 * kPanel + kPanel)));
  const __m512i second = _mm512_cvtepu8_epi32(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + (g + 1) * 2 * kPanel + kPanel)));
  return _mm512_or_si512(first, _mm512_slli_epi32(second, 16));
}

// part[i] += dot[i] · 2^shift · scale: a group's (or half's) dots at the super-block's step.
template <int MT>
inline void add_scaled(const SuperQuantizedRows& x, int64_t m0, int64_t g, const __m512i* dot,
                       __m512 scale, __m512* part) {
#pragma GCC unroll 8
  for (int i = 0; i < MT; ++i) {
    const __m512i exact =
        _mm512_sllv_epi32(dot[i], _mm512_set1_epi32(x.shift[(m0 + i) * x.groups + g]));
    part[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), scale, part[i]);
  }
}

// out[i] = the panel's 16 outputs for rows m0 .. m0 + MT of x.
template <Form F, int MT>
void panel_groups(const SuperQuantizedRows& x, int64_t m0, const BlockWeight& w, int64_t p,
                  __m512* out) {
  constexpr int64_t kGroupBytes = planes_of(F) * 4 * kPanel;
  const int64_t groups = x.groups, supers = x.supers;
  const uint8_t* values = w.values + p * groups * kGroupBytes;
  const uint8_t* codes = w.codes + p * groups * 2 * kPanel;
  const float* factors = w.supers + p * supers * 2 * kPanel;
  __m512 acc[MT], part[MT];
  __m512i dot[MT];
#pragma GCC unroll 8
  for (int i = 0; i < MT; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t s = 0; s < supers; ++s) {
    const __m512 d = _mm512_loadu_ps(factors + s * 2 * kPanel);
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i) part[i] = _mm512_setzero_ps();
    for (int64_t g = s * kGroupsPerSuper; g < (s + 1) * kGroupsPerSuper; ++g) {
      const uint8_t* code = codes + g * 2 * kPanel;
      fetch_ahead<F, MT>(values + g * kGroupBytes);
      if constexpr (F == Form::kSix) {  // a scale per half, no min
        const uint8_t* group = values + g * kGroupBytes;
        six_half<0, MT>(x, m0, g, group, dot);
        add_scaled<MT>(x, m0, g, dot, group_factor<true>(code, d), part);
        six_half<1, MT>(x, m0, g, group, dot);
        add_scaled<MT>(x, m0, g, dot, group_factor<true>(code + kPanel, d), part);
      } else {
        group_dots<F, MT>(x, m0, g, values + g * kGroupBytes, dot);
        add_scaled<MT>(x, m0, g, dot, group_factor(code, d), part);
      }
    }
    if constexpr (F != Form::kSix) {  // − dmin · Σ m·Σq, in integers two groups at a time
      const __m512 dmin = _mm512_loadu_ps(factors + s * 2 * kPanel + kPanel);
      __m512i mins[MT];
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i) mins[i] = _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int64_t j = 0; j < kGroupsPerSuper; j += 2) {
        const int64_t g = s * kGroupsPerSuper + j;
        const __m512i pair = min_pair(codes, g);
#pragma GCC unroll 8
        for (int i = 0; i < MT; ++i) {
          const int32_t sums = x.sum_pairs[((m0 + i) * groups + g) / 2];
          mins[i] = _mm512_dpwssd_epi32(mins[i], pair, _mm512_set1_epi32(sums));
        }
      }
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i) {
        part[i] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mins[i]), dmin, part[i]);
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i) {
      acc[i] = _mm512_fmadd_ps(part[i], _mm512_set1_ps(x.step[(m0 + i) * supers + s]), acc[i]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MT; ++i) out[i] = acc[i];
}

// The same over per-32 blocks (Q4_0 .. Q8_0): each group `d · (u − offset) + m`, d and m fp16
// per output. Σ (u − offset)·q is exact (the dot starts from −offset · Σq), then
//     y += (Σ (u − offset)·q) · (d · s) + m · (s · Σq)
template <Form F, bool kAffine, int MT>
void panel_flat(const GroupQuantizedRows& x, int64_t m0, const FlatWeight& w, int64_t p,
                __m512* out) {
  constexpr int64_t kGroupBytes = planes_of(F) * 4 * kPanel;
  constexpr int64_t kFactors = kAffine ? 2 : 1;
  const int64_t groups = x.groups;
  const uint8_t* values = w.values + p * groups * kGroupBytes;
  const uint16_t* factors = w.factors + p * groups * kFactors * kPanel;
  __m512 acc[MT];
  __m512i dot[MT];
#pragma GCC unroll 8
  for (int i = 0; i < MT; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    fetch_ahead<F, MT>(values + g * kGroupBytes);
    group_dots<F, MT>(x, m0, g, values + g * kGroupBytes, dot, w.offset);
    const uint16_t* factor = factors + g * kFactors * kPanel;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(factor)));
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i) {
      const __m512 scaled = _mm512_mul_ps(d, _mm512_set1_ps(x.scale[(m0 + i) * groups + g]));
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i]), scaled, acc[i]);
    }
    if constexpr (kAffine) {
      const __m512 m = _mm512_cvtph_ps(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(factor + kPanel)));
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i) {
        acc[i] = _mm512_fmadd_ps(m, _mm512_set1_ps(x.sum[(m0 + i) * groups + g]), acc[i]);
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MT; ++i) out[i] = acc[i];
}

// x quantized as a weight's kind needs it: per super-block for the K-quants, per group else.
template <typename W>
using RowsFor =
    std::conditional_t<std::is_same_v<W, BlockWeight>, SuperQuantizedRows, GroupQuantizedRows>;

template <typename W>
using PanelFn = void (*)(const RowsFor<W>&, int64_t, const W&, int64_t, __m512*);

template <Form F>
PanelFn<BlockWeight> panel_for(int64_t rows) {
  static constexpr PanelFn<BlockWeight> kPanels[] = {
      panel_groups<F, 1>, panel_groups<F, 2>, panel_groups<F, 3>, panel_groups<F, 4>,
      panel_groups<F, 5>, panel_groups<F, 6>, panel_groups<F, 7>, panel_groups<F, 8>};
  static_assert(sizeof(kPanels) / sizeof(kPanels[0]) == kMaxRows);
  return kPanels[rows - 1];
}

PanelFn<BlockWeight> panel_for(const BlockWeight& w, int64_t rows) {
  switch (w.planes) {
    case 4: return panel_for<Form::kNibbles>(rows);
    case 5: return panel_for<Form::kFive>(rows);
    case 6: return panel_for<Form::kSix>(rows);
    default: return panel_for<Form::kBytes>(rows);
  }
}

template <Form F, bool kAffine>
PanelFn<FlatWeight> flat_panel_for(int64_t rows) {
  static constexpr PanelFn<FlatWeight> kPanels[] = {
      panel_flat<F, kAffine, 1>, panel_flat<F, kAffine, 2>, panel_flat<F, kAffine, 3>,
      panel_flat<F, kAffine, 4>, panel_flat<F, kAffine, 5>, panel_flat<F, kAffine, 6>,
      panel_flat<F, kAffine, 7>, panel_flat<F, kAffine, 8>};
  static_assert(sizeof(kPanels) / sizeof(kPanels[0]) == kMaxRows);
  return kPanels[rows - 1];
}

template <Form F>
PanelFn<FlatWeight> flat_panel_for(bool affine, int64_t rows) {
  return affine ? flat_panel_for<F, true>(rows) : flat_panel_for<F, false>(rows);
}

PanelFn<FlatWeight> panel_for(const FlatWeight& w, int64_t rows) {
  if (w.planes == 4) return flat_panel_for<Form::kNibbles>(w.affine, rows);
  return w.planes == 5 ? flat_panel_for<Form::kFive>(w.affine, rows)
                       : flat_panel_for<Form::kBytes>(w.affine, rows);
}

// y = x·wᵀ + bias, panel after panel split among the threads.
template <typename W>
void linear_over(const bf16* x, int64_t ldx, const W& w, const bf16* bias, bf16* y, int64_t m,
                 int64_t n, int64_t k) {
  const RowsFor<W> rows_q(x, ldx, m, k);
  at::parallel_for(0, (n + kPanel - 1) / kPanel, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t n0 = p * kPanel;
      const __mmask16 mask = lanes(n - n0);
      const __m512 b = bias != nullptr ? load_bf16x16(bias + n0, mask) : _mm512_setzero_ps();
      __m512 out[kMaxRows];
      // Up to kMaxRows x rows per pass over the panel; later passes find it in L1 or L2.
      for (int64_t m0 = 0; m0 < m; m0 += kMaxRows) {
        const int64_t rows = std::min(kMaxRows, m - m0);
        panel_for(w, rows)(rows_q, m0, w, p, out);
        for (int64_t i = 0; i < rows; ++i) {
          store_bf16x16(y + (m0 + i) * n + n0, mask, _mm512_add_ps(out[i], b));
        }
      }
    }
  });
}

}  // namespace

void block_linear(const bf16* x, int64_t ldx, const BlockWeight& w, const bf16* bias, bf16* y,
                  int64_t m, int64_t n, int64_t k) {
  linear_over(x, ldx, w, bias, y, m, n, k);
}

void flat_linear(const bf16* x, int64_t ldx, const FlatWeight& w, const bf16* bias, bf16* y,
                 int64_t m, int64_t n, int64_t k) {
  linear_over(x, ldx, w, bias, y, m, n, k);
}

}  // namespace semantic
