// Paged decode attention on AVX-512: each sequence's single query token against its K/V blocks,
// read in place through the block table (no gather copy).
//
// Work items are (sequence, span of its tokens), ~16 spans a sequence (sized by its own length
// alone, so its output has the same bits in any batch), taken from a shared counter, so one long
// sequence also uses every core. An item makes two passes:
//   scores  each token's K row (all KV heads, contiguous) is loaded once for all the query
//           heads of each KV head (GQA): bf16 dot products with vdpbf16ps, fp32 sums reduced 16
//           tokens at a time; meanwhile the span's V rows are prefetched into L2;
//   values  softmax weights (fp32; rounded to bf16 pairs for bf16 values) times V, from L2:
//           two tokens per vdpbf16ps; meanwhile the K of the thread's next item is prefetched.
// So memory streams during both passes. Spans of a sequence are then merged by their max and
// sum (online softmax). Measured: 8 sequences x 1,000 tokens, 30 layers, 2 cores: 8.9 ms with
// the next-item prefetch, 10.5 without, 11-12 one tile at a time (flash-decoding style), 12+
// with items per KV head (strided rows).
//
// An 8-bit cache (int8 rows, a bf16 scale per row) is read in place at half the bytes and
// weighed in integers (VNNI), with no row widened to fp32:
//   scores  the query is held in 15 bits per head, as two int8 halves (q16 = 256 · hi + lo); each
//           KV head's 16 key rows are flipped to unsigned (k + 128, vpdpbusd's unsigned side)
//           and transposed once for its G query heads, 4 bytes of a key per lane, so vpdpbusd
//           with 4 bytes of a query half broadcast accumulates the 16 keys' exact dot products
//           side by side (no horizontal sums); 128 · Σq comes off, then the query's scale, the
//           key's and the softmax scale multiply;
//   values  each head's weights times the value rows' scales are quantized over the span to 15
//           bits; two tokens' rows widened to int16 and interleaved, vpdpwssd with the pair of
//           their weights: exact int32 sums, times the weights' scale.
// Its error is the cache's own: against fp32 attention over the dequantized rows, on average
// ~1e-4 of the output's size (the 15-bit query and weights), where the cache's rounding of K/V
// moves it by 1-2e-2. An int8 query (llama.cpp's q8 against a q8_0 cache) was ~10% faster, but
// its own error was as large as the cache's, the total 15-60% larger on average and up to 2x at
// the worst.
// Measured on Qwen2.5-Coder-1.5B's shape (12 query heads, 2 KV heads, head_dim 128), 2 cores
// under load ~3, K/V cold, µs per layer: one sequence of 2,771 keys 140 (284 with each row
// widened to fp32 for fp32 FMAs before; a bf16 cache 216), of 16,000 keys 693 (1,581; 1,104);
// eight sequences 1,182 and 5,814 (2,260 and 12,585). Fixing each pass's head count at compile
// time (`with_count`) then took a bf16 cache's 20-30% off on that shape and an 8-bit cache's
// 7-18% on SmolLM2's (9 query heads, 3 KV heads, 64), within noise of no change on the coder's,
// whose value pass still kept its accumulators on the stack: walking its values once a chunk
// of 32 elements, with the next item's K fetched a little in every walk, took 13-20% off the
// 8-bit cache there (SmolLM2's the same); looking the rows' slots up once a span and taking
// the weights through the instruction's own broadcast then took 6-12% more off the coder's
// (SmolLM2's within noise).
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels.h"

namespace semantic {
namespace {

constexpr int64_t kScoreFloats = 4096;  // an item's scores, heads x span, stay in L1 (16 KiB)
constexpr int64_t kMaxSpan = 512;

// Query heads handled per pass over a span's values: their accumulators fill 16 registers.
template <int D>
constexpr int heads_per_pass() {
  return std::min(8, 64 / (D / 16));
}

// A sequence's K (or V) rows, all KV heads of a token together, token by token through the
// block table.
template <typename T>
struct RowWalk {
  const T* base;
  const int64_t* table;
  int64_t block_tokens, row_stride, block, offset;

  RowWalk(const T* base, const int64_t* table, int64_t block_tokens, int64_t row_stride,
          int64_t start)
      : base(base),
        table(table),
        block_tokens(block_tokens),
        row_stride(row_stride),
        block(start / block_tokens),
        offset(start % block_tokens) {}

  // The pool slot of the next token (its row is base + slot · row_stride), and step past it.
  int64_t next_slot() {
    const int64_t slot = table[block] * block_tokens + offset;
    if (++offset == block_tokens) {
      offset = 0;
      ++block;
    }
    return slot;
  }

  const T* next() { return base + next_slot() * row_stride; }
};

// Prefetches whole rows (all KV heads of a token) into L2, one token per call.
template <typename T>
struct RowPrefetch {
  RowWalk<T> rows;
  int64_t left, row_elems;

  void next() {
    if (left <= 0) return;
    --left;
    const T* row = rows.next();
    for (int64_t e = 0; e < row_elems; e += 64 / static_cast<int64_t>(sizeof(T))) {
      _mm_prefetch(reinterpret_cast<const char*>(row + e), _MM_HINT_T1);
    }
  }
};

// 16 partial sums of q·k over D: bf16 pairs through vdpbf16ps, or fp32 FMAs.
template <int D>
inline __m512i load_pairs(const bf16* p, int c) {
  if (D % 32 != 0 && c == (D + 31) / 32 - 1) return _mm512_maskz_loadu_epi16(0xFFFF, p + 32 * c);
  return _mm512_loadu_si512(p + 32 * c);
}

template <int D>
inline __m512 dot(const bf16* q, const bf16* k) {
  __m512 acc = _mm512_setzero_ps();
  for (int c = 0; c < (D + 31) / 32; ++c) {
    acc = _mm512_dpbf16_ps(acc, (__m512bh)load_pairs<D>(q, c), (__m512bh)load_pairs<D>(k, c));
  }
  return acc;
}

template <int D>
inline __m512 dot(const float* q, const float* k) {
  __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(q), _mm512_loadu_ps(k));
  for (int c = 1; c < D / 16; ++c) {
    acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + 16 * c), _mm512_loadu_ps(k + 16 * c), acc);
  }
  return acc;
}

inline __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1);
}

// The shape of one item's work: all heads of one sequence over one span of its tokens.
struct Span {
  int64_t seq, start, end;
};

struct Layout {
  int64_t heads, kv_heads, group, row_stride, span_stride;
};

// f(std::integral_constant<int, n>()) for a count n in 1..N known at run time, so that a loop
// over that many query heads unrolls whole and keeps its accumulators in registers: a loop
// that may stop early kept them in memory, a load and a store around each multiply-add.
template <int N, typename F>
inline void with_count(int n, const F& f) {
  if constexpr (N > 1) {
    if (n < N) return with_count<N - 1>(n, f);
  }
  f(std::integral_constant<int, N>());
}

// Scores s[h][t] of every query head over tokens [start, start + n), 16 tokens at a time: each
// token's K row (all KV heads, contiguous) is read once, while its V row is prefetched into L2
// for the value pass.
template <typename T, int D>
void span_scores(const T* q, int64_t q_stride_h, const Layout& l, RowWalk<T> keys,
                 RowPrefetch<T> values, int64_t n, float scale, float* s) {
  const __m512 scale_v = _mm512_set1_ps(scale);
  for (int64_t t0 = 0; t0 < n; t0 += 16) {
    const int64_t count = std::min<int64_t>(16, n - t0);
    const T* rows[16];
    for (int64_t i = 0; i < count; ++i) {
      rows[i] = keys.next();
      values.next();
    }
    for (int64_t i = count; i < 16; ++i) rows[i] = rows[0];  // padding, never stored
    for (int64_t h = 0; h < l.kv_heads; ++h) {
      for (int64_t g = 0; g < l.group; ++g) {
        const int64_t head = h * l.group + g;
        const T* qh = q + head * q_stride_h;
        __m512 partial[16];
        for (int i = 0; i < 16; ++i) partial[i] = dot<D>(qh, rows[i] + h * D);
        _mm512_mask_storeu_ps(s + head * l.span_stride + t0, first_lanes(count),
                              _mm512_mul_ps(hsum16(partial), scale_v));
      }
    }
  }
}

// Every query of an 8-bit cache in 15 bits per head, q ≈ q16 · scale (q16 within ±127 · 256),
// held as two int8 halves q16 = 256 · hi + lo (hi in ±127, lo in -128..127) for vpdpbusd, each
// head's D bytes zero-padded to whole 64-byte vectors. The keys are flipped to unsigned (k + 128)
// for vpdpbusd, so 128 · Σhi and 128 · Σlo come off the halves' dot products (`bias`).
struct QueriesI8 {
  std::vector<int8_t> hi, lo;  // [B][H][padded D]
  std::vector<float> scales;   // [B][H]
  std::vector<int32_t> bias;   // [B][H][2]: hi's, lo's
};

constexpr float kQueryLevels = 127.0f * 256.0f;

template <int D>
constexpr int64_t padded_i8() {
  return (D + 63) / 64 * 64;
}

template <typename T, int D>
QueriesI8 queries_i8(const DecodeProblem& p) {
  constexpr int64_t W = padded_i8<D>();
  const int64_t rows = p.batch * p.heads;
  QueriesI8 q{std::vector<int8_t>(rows * W, 0), std::vector<int8_t>(rows * W, 0),
              std::vector<float>(rows), std::vector<int32_t>(rows * 2)};
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.heads; ++h) {
      const T* src = static_cast<const T*>(p.q) + b * p.q_stride_b + h * p.q_stride_h;
      const int64_t row = b * p.heads + h;
      __m512 x[D / 16];
      __m512 top = _mm512_setzero_ps();
      for (int c = 0; c < D / 16; ++c) {
        x[c] = load_x16(src + 16 * c);
        top = _mm512_max_ps(top, _mm512_abs_ps(x[c]));
      }
      const float amax = _mm512_reduce_max_ps(top);
      const __m512 inv = _mm512_set1_ps(amax > 0.0f ? kQueryLevels / amax : 0.0f);
      __m512i sum_hi = _mm512_setzero_si512(), sum_lo = _mm512_setzero_si512();
      for (int c = 0; c < D / 16; ++c) {
        const __m512i q16 = _mm512_cvtps_epi32(_mm512_mul_ps(x[c], inv));  // nearest, even on ties
        const __m512i hi = _mm512_srai_epi32(_mm512_add_epi32(q16, _mm512_set1_epi32(128)), 8);
        const __m512i lo = _mm512_sub_epi32(q16, _mm512_slli_epi32(hi, 8));
        sum_hi = _mm512_add_epi32(sum_hi, hi);
        sum_lo = _mm512_add_epi32(sum_lo, lo);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(&q.hi[row * W + 16 * c]),
                         _mm512_cvtepi32_epi8(hi));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(&q.lo[row * W + 16 * c]),
                         _mm512_cvtepi32_epi8(lo));
      }
      q.scales[row] = amax / kQueryLevels;
      q.bias[2 * row] = 128 * _mm512_reduce_add_epi32(sum_hi);
      q.bias[2 * row + 1] = 128 * _mm512_reduce_add_epi32(sum_lo);
    }
  }
  return q;
}

// 64 bytes of an int8 row (its D bytes, zero-padded, where D < 64).
template <int D>
inline __m512i load_i8x64(const int8_t* row, int c) {
  if constexpr (D < 64) return _mm512_maskz_loadu_epi8((1ull << D) - 1, row);
  return _mm512_loadu_si512(row + 64 * c);
}

// 16 x 16 int32 transposed in registers: lane j of r[i] goes to lane i of r[j].
inline void transpose16_epi32(__m512i* r) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {  // per 128-bit lane: a0 b0 a1 b1 | a2 b2 a3 b3
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // u[4i + k], per 128-bit lane L: element 4L + k of rows 4i..4i+3
    u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int k = 0; k < 4; ++k) {  // gather lane L of u[k], u[4 + k], u[8 + k], u[12 + k]
    const __m512i v = _mm512_shuffle_i32x4(u[k], u[4 + k], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512i w = _mm512_shuffle_i32x4(u[k], u[4 + k], _MM_SHUFFLE(3, 1, 3, 1));
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512i w2 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], _MM_SHUFFLE(3, 1, 3, 1));
    r[k] = _mm512_shuffle_i32x4(v, v2, _MM_SHUFFLE(2, 0, 2, 0));
    r[8 + k] = _mm512_shuffle_i32x4(v, v2, _MM_SHUFFLE(3, 1, 3, 1));
    r[4 + k] = _mm512_shuffle_i32x4(w, w2, _MM_SHUFFLE(2, 0, 2, 0));
    r[12 + k] = _mm512_shuffle_i32x4(w, w2, _MM_SHUFFLE(3, 1, 3, 1));
  }
}

// Query heads whose scores one pass over a KV head's transposed keys computes: two int32
// accumulators each (q's halves).
constexpr int kScoreHeads = 6;

// An 8-bit cache's scores, in integers: for each KV head, its 16 key rows are flipped to
// unsigned (k + 128, an xor of the sign bit) and transposed once, in L1, for its G query heads,
// so that lane i of column j holds bytes 4j..4j+3 of key i; vpdpbusd multiplies a column with
// four bytes of a query half broadcast, and the 16 lanes are the 16 keys' exact dot products
// (no horizontal sums). A score is (256 · (hi · k) + lo · k) · q_scale · k_scale · scale.
template <int D>
void span_scores_i8(const QueriesI8& q, int64_t first_row, const Layout& l, const int8_t* keys,
                    const int64_t* span_slots, const bf16* k_scales, RowPrefetch<int8_t> values,
                    int64_t n, float scale, float* s) {
  constexpr int C = padded_i8<D>() / 64, J = D / 4;  // 64-byte chunks; columns with data
  constexpr int64_t W = padded_i8<D>();
  alignas(64) __m512i cols[C * 16];
  alignas(64) float key_scale[16];
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t t0 = 0; t0 < n; t0 += 16) {
    const int64_t count = std::min<int64_t>(16, n - t0);
    int64_t slots[16];
    for (int64_t i = 0; i < count; ++i) {
      slots[i] = span_slots[t0 + i];
      values.next();
    }
    for (int64_t i = count; i < 16; ++i) slots[i] = slots[0];  // padding, never stored
    for (int64_t h = 0; h < l.kv_heads; ++h) {
      for (int c = 0; c < C; ++c) {
        __m512i r[16];
        for (int i = 0; i < 16; ++i) {
          const int8_t* row = keys + slots[i] * l.row_stride + h * D;
          r[i] = _mm512_xor_si512(load_i8x64<D>(row, c), sign);
        }
        transpose16_epi32(r);
        for (int j = 0; j < 16; ++j) cols[16 * c + j] = r[j];
      }
      for (int i = 0; i < 16; ++i) {
        key_scale[i] = bf16_to_float(k_scales[slots[i] * l.kv_heads + h]) * scale;
      }
      const __m512 scale_v = _mm512_load_ps(key_scale);
      for (int64_t g0 = 0; g0 < l.group; g0 += kScoreHeads) {
        const int heads = static_cast<int>(std::min<int64_t>(kScoreHeads, l.group - g0));
        const int64_t head0 = h * l.group + g0;
        const int8_t* hi = q.hi.data() + (first_row + head0) * W;
        const int8_t* lo = q.lo.data() + (first_row + head0) * W;
        with_count<kScoreHeads>(heads, [&](auto fixed) {
          constexpr int G = decltype(fixed)::value;
          __m512i acc_hi[G], acc_lo[G];
          for (int g = 0; g < G; ++g) acc_hi[g] = acc_lo[g] = _mm512_setzero_si512();
          for (int j = 0; j < J; ++j) {
            const __m512i col = cols[j];
            for (int g = 0; g < G; ++g) {
              acc_hi[g] = dot_broadcast(acc_hi[g], col, hi + g * W + 4 * j);
              acc_lo[g] = dot_broadcast(acc_lo[g], col, lo + g * W + 4 * j);
            }
          }
          for (int g = 0; g < G; ++g) {
            const int64_t row = first_row + head0 + g;
            const __m512 dot_hi = _mm512_cvtepi32_ps(
                _mm512_sub_epi32(acc_hi[g], _mm512_set1_epi32(q.bias[2 * row])));
            const __m512 dot_lo = _mm512_cvtepi32_ps(
                _mm512_sub_epi32(acc_lo[g], _mm512_set1_epi32(q.bias[2 * row + 1])));
            const __m512 dot = _mm512_fmadd_ps(dot_hi, _mm512_set1_ps(256.0f), dot_lo);
            const __m512 sc =
                _mm512_mul_ps(dot, _mm512_mul_ps(scale_v, _mm512_set1_ps(q.scales[row])));
            _mm512_mask_storeu_ps(s + (head0 + g) * l.span_stride + t0, first_lanes(count), sc);
          }
        });
      }
    }
  }
}

// Each head's scores -> weights exp(score - max), in place as fp32 and, for bf16 values, as
// bf16 pairs in `pb` (padded with a zero to an even count); ml[h] = (max, sum of the weights).
template <typename T>
void span_softmax(int64_t heads, int64_t stride, int64_t n, float* s, bf16* pb, float* ml) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t h = 0; h < heads; ++h, s += stride, pb += stride) {
    __m512 mv = neg_inf;
    for (int64_t t0 = 0; t0 < n; t0 += 16) {
      mv = _mm512_max_ps(mv, _mm512_mask_loadu_ps(neg_inf, first_lanes(n - t0), s + t0));
    }
    const float m = _mm512_reduce_max_ps(mv);
    const __m512 m_v = _mm512_set1_ps(m);
    __m512 lv = _mm512_setzero_ps();
    for (int64_t t0 = 0; t0 < n; t0 += 16) {
      const __mmask16 mask = first_lanes(n - t0);
      const __m512 x = _mm512_mask_loadu_ps(neg_inf, mask, s + t0);
      __m512 p = exp_nonpositive(_mm512_sub_ps(x, m_v));
      if constexpr (std::is_same_v<T, bf16>) {
        // The value pass weighs with the rounded weights: normalise by their sum too.
        const __m256i rounded = (__m256i)_mm512_cvtneps_pbh(p);
        _mm256_mask_storeu_epi16(pb + t0, mask, rounded);
        p = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(rounded), 16));
      } else {
        _mm512_mask_storeu_ps(s + t0, mask, p);
      }
      lv = _mm512_add_ps(lv, p);
    }
    if (n % 2 != 0) pb[n] = 0;
    ml[2 * h] = m;
    ml[2 * h + 1] = _mm512_reduce_add_ps(lv);
  }
}

// acc[g][0..D) = sum over the span of p[g][t] * v[t] for NG query heads of one KV head, whose
// V rows `values` walks. fp32: one FMA per weight and value.
template <int D, int NG>
void span_values(int64_t stride, RowWalk<float> values, int64_t n, const float* p, const bf16*,
                 RowPrefetch<float>& ahead, float* acc) {
  constexpr int C = D / 16;
  __m512 o[NG][C];
  for (int g = 0; g < NG; ++g)
    for (int c = 0; c < C; ++c) o[g][c] = _mm512_setzero_ps();
  for (int64_t t = 0; t < n; ++t) {
    const float* row = values.next();
    ahead.next();
    __m512 v[C];
    for (int c = 0; c < C; ++c) v[c] = _mm512_loadu_ps(row + 16 * c);
    for (int g = 0; g < NG; ++g) {
      const __m512 w = _mm512_set1_ps(p[g * stride + t]);
      for (int c = 0; c < C; ++c) o[g][c] = _mm512_fmadd_ps(w, v[c], o[g][c]);
    }
  }
  for (int g = 0; g < NG; ++g)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc + g * D + 16 * c, o[g][c]);
}

// The sums of interleaved pairs of rows back in order: lo lane 4L + j holds element 8L + j of
// 32-element chunk c, hi lane 4L + j element 8L + 4 + j (a D % 32 == 16 row's last chunk is half).
template <int D>
inline void store_pair_lanes(float* row, int c, __m512 lo, __m512 hi) {
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second =
      _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  float* out = row + 32 * c;
  _mm512_storeu_ps(out, _mm512_permutex2var_ps(lo, first, hi));
  if (D % 32 == 0 || c < (D + 31) / 32 - 1) {
    _mm512_storeu_ps(out + 16, _mm512_permutex2var_ps(lo, second, hi));
  }
}

// An 8-bit cache's weights: each query head's softmax weights times each token's value scale,
// quantized over the span to 15 bits (w ≈ w16 · w_scale, w_scale = max w / 32767) as int16
// pairs in `w16` (padded with a zero to an even count). `vscale` holds the span's value scales of
// their KV head. With at most kMaxSpan tokens a head's int32 sums cannot overflow.
static_assert(kMaxSpan * 32767LL * 128 < (1LL << 31));

void span_weights_i16(int heads, int64_t stride, int64_t n, const float* p, const float* vscale,
                      int16_t* w16, float* w_scale) {
  for (int g = 0; g < heads; ++g, p += stride, w16 += stride) {
    __m512 top = _mm512_setzero_ps();
    for (int64_t t0 = 0; t0 < n; t0 += 16) {
      const __mmask16 mask = first_lanes(n - t0);
      top = _mm512_max_ps(top, _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, p + t0),
                                             _mm512_maskz_loadu_ps(mask, vscale + t0)));
    }
    const float wmax = _mm512_reduce_max_ps(top);
    const __m512 inv = _mm512_set1_ps(wmax > 0.0f ? 32767.0f / wmax : 0.0f);
    for (int64_t t0 = 0; t0 < n; t0 += 16) {
      const __mmask16 mask = first_lanes(n - t0);
      const __m512 w = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, p + t0),
                                     _mm512_maskz_loadu_ps(mask, vscale + t0));
      const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(w, inv));
      _mm256_mask_storeu_epi16(w16 + t0, mask, _mm512_cvtsepi32_epi16(q));
    }
    if (n % 2 != 0) w16[n] = 0;
    w_scale[g] = wmax / 32767.0f;
  }
}

// 32 int8 of a value row widened to int16 (its first 16 only in a D % 32 == 16 row's last chunk).
template <int D>
inline __m512i load_i8x32_as_i16(const int8_t* row, int c) {
  if (D % 32 != 0 && c == (D + 31) / 32 - 1) {
    return _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(0xFFFF, row + 32 * c));
  }
  return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 32 * c)));
}

// int8 values (an 8-bit cache), in integers: two tokens at a time, their rows widened to int16
// and interleaved element by element (as bf16 rows are below) are pairs that vpdpwssd weighs
// with the pair of their 15-bit weights, 32 exact multiply-adds an instruction; the int32 sums
// times the heads' weight scales are the fp32 accumulators. The rows are walked once per CB
// chunks of 32 elements, two where NG heads' accumulators (two a chunk) fit in 16 registers,
// else one: with 24 (two chunks of 6 heads) GCC kept most of them on the stack, a store and a
// load around each multiply-add. The next item's K is fetched a little in every walk. The rows'
// pool slots come looked up once a span (`slots`), not again in every walk; a pair of weights
// that serves one chunk's two multiply-adds is broadcast by each instruction (as the scores
// pass's query bytes), one that serves two chunks' four is loaded once into a register.
constexpr int kValueHeads = 8;  // heads a pass at most: 16 accumulators at a chunk a walk

template <int D, int NG>
constexpr int chunks_per_walk() {
  return (D + 31) / 32 % 2 == 0 && NG * 4 <= 16 ? 2 : 1;
}

template <int D, int NG>
void span_values_i8(int64_t stride, const int8_t* base, const int64_t* slots, int64_t row_stride,
                    int64_t n, const int16_t* w16, const float* w_scale,
                    RowPrefetch<int8_t>& ahead, float* acc) {
  constexpr int C = (D + 31) / 32, CB = chunks_per_walk<D, NG>(), walks = C / CB;
  static_assert(NG <= kValueHeads);
  for (int c0 = 0; c0 < C; c0 += CB) {
    __m512i lo[NG][CB], hi[NG][CB];
    for (int g = 0; g < NG; ++g)
      for (int c = 0; c < CB; ++c) lo[g][c] = hi[g][c] = _mm512_setzero_si512();
    for (int64_t t = 0; t < n; t += 2) {
      // an odd span's last pair: its second token (the first again) has the weight 0
      const int8_t* a = base + slots[t] * row_stride;
      const int8_t* b = base + slots[t + 1 < n ? t + 1 : t] * row_stride;
      if ((t / 2) % walks == c0 / CB) {
        ahead.next();
        ahead.next();
      }
      __m512i vlo[CB], vhi[CB];
      for (int c = 0; c < CB; ++c) {
        const __m512i va = load_i8x32_as_i16<D>(a, c0 + c);
        const __m512i vb = load_i8x32_as_i16<D>(b, c0 + c);
        vlo[c] = _mm512_unpacklo_epi16(va, vb);
        vhi[c] = _mm512_unpackhi_epi16(va, vb);
      }
      for (int g = 0; g < NG; ++g) {
        const int16_t* w = w16 + g * stride + t;
        if constexpr (CB == 1) {  // two uses: broadcast by each instruction
          lo[g][0] = pair_dot_broadcast(lo[g][0], vlo[0], w);
          hi[g][0] = pair_dot_broadcast(hi[g][0], vhi[0], w);
        } else {  // four: one register
          uint32_t pair;
          __builtin_memcpy(&pair, w, 4);
          const __m512i wv = _mm512_set1_epi32(static_cast<int>(pair));
          for (int c = 0; c < CB; ++c) {
            lo[g][c] = _mm512_dpwssd_epi32(lo[g][c], vlo[c], wv);
            hi[g][c] = _mm512_dpwssd_epi32(hi[g][c], vhi[c], wv);
          }
        }
      }
    }
    for (int g = 0; g < NG; ++g) {
      const __m512 ws = _mm512_set1_ps(w_scale[g]);
      for (int c = 0; c < CB; ++c) {
        store_pair_lanes<D>(acc + g * D, c0 + c, _mm512_mul_ps(_mm512_cvtepi32_ps(lo[g][c]), ws),
                            _mm512_mul_ps(_mm512_cvtepi32_ps(hi[g][c]), ws));
      }
    }
  }
}

// bf16: two tokens at a time. Their V rows interleaved element by element (unpacklo/hi) are
// bf16 pairs that vdpbf16ps weighs with the pair of their two weights, so each instruction
// does 32 multiply-adds. The unpacks permute the output lanes within each 32 elements; the
// store puts them back in order.
template <int D, int NG>
void span_values(int64_t stride, RowWalk<bf16> values, int64_t n, const float*, const bf16* pb,
                 RowPrefetch<bf16>& ahead, float* acc) {
  constexpr int C = (D + 31) / 32;  // 32-element chunks; D % 32 == 16 leaves a half chunk
  __m512 lo[NG][C], hi[NG][C];
  for (int g = 0; g < NG; ++g)
    for (int c = 0; c < C; ++c) lo[g][c] = hi[g][c] = _mm512_setzero_ps();
  for (int64_t t = 0; t < n; t += 2) {
    const bf16* a = values.next();
    const bf16* b = t + 1 < n ? values.next() : nullptr;
    ahead.next();
    ahead.next();
    __m512i vlo[C], vhi[C];
    for (int c = 0; c < C; ++c) {
      const __m512i va = load_pairs<D>(a, c);
      const __m512i vb = b != nullptr ? load_pairs<D>(b, c) : _mm512_setzero_si512();
      vlo[c] = _mm512_unpacklo_epi16(va, vb);
      vhi[c] = _mm512_unpackhi_epi16(va, vb);
    }
    for (int g = 0; g < NG; ++g) {
      uint32_t pair;
      __builtin_memcpy(&pair, pb + g * stride + t, 4);
      const __m512bh w = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
      for (int c = 0; c < C; ++c) {
        lo[g][c] = _mm512_dpbf16_ps(lo[g][c], w, (__m512bh)vlo[c]);
        hi[g][c] = _mm512_dpbf16_ps(hi[g][c], w, (__m512bh)vhi[c]);
      }
    }
  }
  for (int g = 0; g < NG; ++g)
    for (int c = 0; c < C; ++c) store_pair_lanes<D>(acc + g * D, c, lo[g][c], hi[g][c]);
}

// One work item: every head of one sequence over one span; acc [H][D], ml [H][2]. Memory is
// kept busy throughout: the scores pass streams the span's K and prefetches its V into L2,
// the values pass (from L2) prefetches the K of the item this thread takes next. KV is the
// caches' type: T, or int8_t for an 8-bit cache (then q8 holds every query in int8).
// Flattened: with a variant for each head count (`with_count`) GCC otherwise calls the passes
// out of line, and they lose what the fixed counts gain.
template <typename T, typename KV, int D>
__attribute__((flatten)) void attend_span(const DecodeProblem& p, const Layout& l,
                                          const Span& span, const Span* next, const QueriesI8& q8,
                                          float* acc, float* ml) {
  constexpr bool quantized = std::is_same_v<KV, int8_t>;
  constexpr int NG = quantized ? kValueHeads : heads_per_pass<D>();
  const int64_t n = span.end - span.start;
  const KV* k = static_cast<const KV*>(p.k_cache);
  const KV* v = static_cast<const KV*>(p.v_cache);
  auto walk = [&](const KV* cache, const Span& s) {
    return RowWalk<KV>(cache, p.block_tables + s.seq * p.table_stride, p.block_tokens,
                       l.row_stride, s.start);
  };
  alignas(64) float s[kScoreFloats];
  alignas(64) bf16 pb[kScoreFloats + 16];
  const RowPrefetch<KV> values_ahead{walk(v, span), n, l.row_stride};
  // An 8-bit cache's span: its pool slots (K's and V's alike) looked up once for both passes,
  // every KV head and chunk.
  int64_t slots[kMaxSpan];
  if constexpr (quantized) {
    RowWalk<KV> rows = walk(k, span);
    for (int64_t t = 0; t < n; ++t) slots[t] = rows.next_slot();
    span_scores_i8<D>(q8, span.seq * p.heads, l, k, slots, p.k_scales, values_ahead, n, p.scale,
                      s);
  } else {
    const T* q = static_cast<const T*>(p.q) + span.seq * p.q_stride_b;
    span_scores<T, D>(q, p.q_stride_h, l, walk(k, span), values_ahead, n, p.scale, s);
  }
  // int8 values take fp32 weights, quantized below with the values' scales.
  span_softmax<std::conditional_t<quantized, float, T>>(l.heads, l.span_stride, n, s, pb, ml);
  RowPrefetch<KV> ahead{walk(k, next != nullptr ? *next : span),
                        next != nullptr ? next->end - next->start : 0, l.row_stride};
  alignas(64) float vscale[kMaxSpan];
  for (int64_t h = 0; h < l.kv_heads; ++h) {
    if constexpr (quantized) {
      for (int64_t t = 0; t < n; ++t) {
        vscale[t] = bf16_to_float(p.v_scales[slots[t] * l.kv_heads + h]);
      }
    }
    for (int64_t g0 = 0; g0 < l.group; g0 += NG) {
      const int64_t head = h * l.group + g0;
      const int heads = static_cast<int>(std::min<int64_t>(NG, l.group - g0));
      const int64_t offset = head * l.span_stride;
      if constexpr (quantized) {
        int16_t* w16 = reinterpret_cast<int16_t*>(pb) + offset;
        float w_scale[NG];
        span_weights_i16(heads, l.span_stride, n, s + offset, vscale, w16, w_scale);
        with_count<NG>(heads, [&](auto fixed) {
          span_values_i8<D, decltype(fixed)::value>(l.span_stride, v + h * D, slots,
                                                    l.row_stride, n, w16, w_scale, ahead,
                                                    acc + head * D);
        });
      } else {
        with_count<NG>(heads, [&](auto fixed) {
          span_values<D, decltype(fixed)::value>(l.span_stride, walk(v + h * D, span), n,
                                                 s + offset, pb + offset, ahead, acc + head * D);
        });
      }
    }
  }
}

// The first key sequence b reads: its window's first on a sliding layer, else its first.
int64_t first_key(const DecodeProblem& p, int64_t b) {
  return p.window > 0 ? std::max<int64_t>(0, p.context_lens[b] - p.window) : 0;
}

// Each sequence's keys in ~kSpansPerSequence spans, sized by its own length alone: never by the
// batch's or the thread count, so a sequence's output is bit for bit the same whatever decodes
// beside it (a draft's tokens, verified as decodes of one batch, get exactly the logits plain
// decoding gives them), and one long sequence alone still keeps every core busy.
constexpr int64_t kSpansPerSequence = 16;
constexpr int64_t kMinSpan = 16;

std::vector<Span> plan_spans(const DecodeProblem& p, int64_t max_span,
                             std::vector<int64_t>& first_span) {
  std::vector<Span> spans;
  first_span.assign(p.batch + 1, 0);
  for (int64_t b = 0; b < p.batch; ++b) {
    first_span[b] = static_cast<int64_t>(spans.size());
    const int64_t keys = p.context_lens[b] - first_key(p, b);
    const int64_t len =
        std::clamp<int64_t>((keys / kSpansPerSequence + 15) / 16 * 16,
                            std::min(kMinSpan, max_span), max_span);
    for (int64_t start = first_key(p, b); start < p.context_lens[b]; start += len) {
      spans.push_back({b, start, std::min(start + len, p.context_lens[b])});
    }
  }
  first_span[p.batch] = static_cast<int64_t>(spans.size());
  return spans;
}

// out[b, h] = the spans' weighted sums, rescaled to one max and divided by the total weight;
// a head's sink logit, where there is one, adds its weight to the total and nothing to the sum.
template <typename T, int D>
void merge_spans(const DecodeProblem& p, const std::vector<int64_t>& first_span,
                 const float* acc, const float* ml) {
  constexpr int C = D / 16;
  at::parallel_for(0, p.batch * p.heads, 32, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / p.heads, h = bh % p.heads;
      T* out = static_cast<T*>(p.out) + bh * D;
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t i = first_span[b]; i < first_span[b + 1]; ++i) {
        m = std::max(m, ml[(i * p.heads + h) * 2]);
      }
      if (p.sinks != nullptr) m = std::max(m, p.sinks[h]);
      __m512 o[C];
      for (int c = 0; c < C; ++c) o[c] = _mm512_setzero_ps();
      float total = 0.0f;
      for (int64_t i = first_span[b]; i < first_span[b + 1]; ++i) {
        const int64_t row = i * p.heads + h;
        const __m512 w = exp_nonpositive(_mm512_set1_ps(ml[2 * row] - m));
        total += _mm512_cvtss_f32(w) * ml[2 * row + 1];
        for (int c = 0; c < C; ++c) {
          o[c] = _mm512_fmadd_ps(w, _mm512_loadu_ps(acc + row * D + 16 * c), o[c]);
        }
      }
      if (p.sinks != nullptr) total += std::exp(p.sinks[h] - m);
      const __m512 inv = _mm512_set1_ps(total > 0.0f ? 1.0f / total : 0.0f);
      for (int c = 0; c < C; ++c) store_x16(out + 16 * c, _mm512_mul_ps(o[c], inv));
    }
  });
}

template <typename T, typename KV, int D>
void paged_decode(const DecodeProblem& p) {
  const int64_t group = p.heads / p.kv_heads;
  const int64_t max_span = std::min<int64_t>(kMaxSpan, kScoreFloats / p.heads / 16 * 16);
  const Layout l{p.heads, p.kv_heads, group, p.kv_heads * D, max_span};
  std::vector<int64_t> first_span;
  const std::vector<Span> spans = plan_spans(p, max_span, first_span);
  const int64_t items = static_cast<int64_t>(spans.size());
  std::vector<float> acc(items * p.heads * D), ml(items * p.heads * 2);
  const QueriesI8 q8 = std::is_same_v<KV, int8_t> ? queries_i8<T, D>(p) : QueriesI8{};
  std::atomic<int64_t> next{0};
  // One task per thread, each taking items off the counter until none are left.
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    for (int64_t i = next.fetch_add(1); i < items;) {
      const int64_t j = next.fetch_add(1);  // taken now, so its K streams in during item i
      const Span* following = j < items ? &spans[j] : nullptr;
      attend_span<T, KV, D>(p, l, spans[i], following, q8, &acc[i * p.heads * D],
                            &ml[i * p.heads * 2]);
      i = j;
    }
  });
  merge_spans<T, D>(p, first_span, acc.data(), ml.data());
}

template <typename T, typename KV>
void dispatch(const DecodeProblem& p) {
  switch (p.head_dim) {
    case 16: return paged_decode<T, KV, 16>(p);
    case 32: return paged_decode<T, KV, 32>(p);
    case 64: return paged_decode<T, KV, 64>(p);
    case 128: return paged_decode<T, KV, 128>(p);
    case 256: return paged_decode<T, KV, 256>(p);
    default: return;  // decode_supported() said no; the caller checked
  }
}

}  // namespace

bool decode_supported(int64_t head_dim, int64_t heads) {
  const bool dim = head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128 ||
                   head_dim == 256;
  return dim && heads >= 1 && heads <= kScoreFloats / 16;  // a span of 16 tokens at least
}

void paged_decode_f32(const DecodeProblem& p) {
  return p.k_scales != nullptr ? dispatch<float, int8_t>(p) : dispatch<float, float>(p);
}
void paged_decode_bf16(const DecodeProblem& p) {
  return p.k_scales != nullptr ? dispatch<bf16, int8_t>(p) : dispatch<bf16, bf16>(p);
}

}  // namespace semantic
