// y = x·wᵀ for a few rows of x (decode batches), and the weight layout it reads.
//
// The weight is packed once, at load, in panels of 16 output rows: [N/16][K/2][16][2], each
// 64 bytes holding one pair of inputs for 16 outputs (oneDNN calls this BA16a16b2a). A panel
// is streamed from memory in address order; each 64-byte load meets every x row through
// vdpbf16ps with that row's input pair broadcast (a 4-byte load), giving 16 outputs per
// accumulator with no horizontal sums. Each weight byte is read from memory once per call,
// whatever the row count: bandwidth-bound up to ~8 rows, compute-bound from ~16 (one
// vdpbf16ps per row per 64 bytes). Threads split the panels into contiguous ranges.
//
// Measured against plain [N, K] rows read one after another (x rows as 64-byte loads, sums
// reduced by an add tree): 15-16 ms vs 11-13 ms for all of SmolLM2-135M's linears at 8 rows,
// ~30 vs ~22 at 16; a 64-byte load of x per instruction costs more than a 4-byte broadcast.
// Interleaving several rows' streams to share x loads was slower still (the prefetchers lose
// the streams).
//
// 8-bit weights take the same panels at a byte a value and VNNI's byte dot product
// (vpdpbusd: 64 multiply-adds an instruction, twice vdpbf16ps's, and no widening of the
// weight), with x quantized to int8 per block of 32 values as it comes in (as llama.cpp does
// for its quantized weights). Every layer's linears of SmolLM2-135M (ms, quiet 2-core Zen 4,
// medians of 3, `benchmarks/runner_microbench.py --weights both --linear-rows ...`):
//
//     rows                     1      4      8      16     128    512
//     bf16 panels (vdpbf16ps)  8.1    9.4    14.1   25.1   113    431 (unpacked for oneDNN)
//     int8 panels (vpdpbusd)   4.5    5.1    8.1    14.4   65     265
//
// The int8 kernel runs at every row count: above 128 rows it beats unpacking for oneDNN too.
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "kernels.h"

namespace semantic {
namespace {

constexpr int64_t kPanel = 16;  // output rows per panel

inline __m512bh broadcast_pair(const bf16* p) {
  int32_t pair;
  __builtin_memcpy(&pair, p, 4);
  return (__m512bh)_mm512_set1_epi32(pair);
}

// out[m] = the panel's 16 outputs for x row m. One accumulator per row, summed in the same
// order whatever the row count, so a row's result does not depend on its batch. An odd K
// ends on a half pair: x's last input alone.
template <int MT>
void panel(const bf16* const* x, const bf16* w, int64_t k, __m512* out) {
  __m512 acc[MT];
  for (int m = 0; m < MT; ++m) acc[m] = _mm512_setzero_ps();
  const int64_t pairs = k / 2;
  for (int64_t j = 0; j < pairs; ++j) {
    const __m512bh wv = (__m512bh)_mm512_loadu_si512(w + j * 2 * kPanel);
    for (int m = 0; m < MT; ++m) {
      acc[m] = _mm512_dpbf16_ps(acc[m], broadcast_pair(x[m] + 2 * j), wv);
    }
  }
  if (k % 2 != 0) {
    const __m512bh wv = (__m512bh)_mm512_loadu_si512(w + pairs * 2 * kPanel);
    for (int m = 0; m < MT; ++m) {
      acc[m] = _mm512_dpbf16_ps(acc[m], (__m512bh)_mm512_set1_epi32(x[m][k - 1]), wv);
    }
  }
  for (int m = 0; m < MT; ++m) out[m] = acc[m];
}

using PanelFn = void (*)(const bf16* const*, const bf16*, int64_t, __m512*);

PanelFn panel_for(int64_t rows) {
  static constexpr PanelFn kPanels[] = {
      panel<1>, panel<2>,  panel<3>,  panel<4>,  panel<5>,  panel<6>,  panel<7>,  panel<8>,
      panel<9>, panel<10>, panel<11>, panel<12>, panel<13>, panel<14>, panel<15>, panel<16>};
  return kPanels[rows - 1];
}

// 16x16 32-bit transpose: column i of the 16 vectors r becomes vector i.
inline void transpose16(__m512i* r) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // u[4i + j], lane L: rows 4i..4i+3 of column 4L + j
    u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int j = 0; j < 4; ++j) {  // gather lane L of u[j], u[4 + j], u[8 + j], u[12 + j]
    const __m512i v0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x44);
    const __m512i v1 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xEE);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x44);
    const __m512i v3 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xEE);
    r[j] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    r[4 + j] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
    r[8 + j] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    r[12 + j] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
  }
}

// The int8 weight's panels: [N/16][Kp/32][8][16][4] bytes, Kp the inputs rounded up to a whole
// block of 32, each 64 bytes four consecutive inputs of 16 outputs; each byte the weight's
// int8 value + 128 (unsigned, as vpdpbusd takes its first operand), padding at 128 (zero).
constexpr int64_t kBlock = 32;         // x values per scale, and weight inputs per block
constexpr int64_t kSteps = kBlock / 4;  // vpdpbusd per row per block: four inputs each

// x's rows quantized per block of 32 values: q = round(x · 127 / the block's largest |x|), in
// -127..127, with the scale s = that largest / 127 (0 for an all-zero block), x ≈ q · s; and
// the block's -128·Σq, which takes the +128 of the weight bytes back out of each block's
// integer dot product.
struct QuantizedRows {
  int64_t blocks;
  std::vector<int8_t> q;        // [M][blocks·32], zero past K
  std::vector<float> scale;     // [M][blocks]
  std::vector<int32_t> offset;  // [M][blocks]

  QuantizedRows(const bf16* x, int64_t ldx, int64_t m, int64_t k)
      : blocks((k + kBlock - 1) / kBlock),
        q(m * blocks * kBlock, 0),
        scale(m * blocks),
        offset(m * blocks) {
    // split among the threads only when there are rows enough to pay for it (prefill)
    at::parallel_for(0, m, 16, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        for (int64_t b = 0; b < blocks; ++b) quantize_block(x + r * ldx, k, r, b);
      }
    });
  }

  void quantize_block(const bf16* row, int64_t k, int64_t r, int64_t b) {
    const int64_t k0 = b * kBlock, n = k - k0;
    const __m512 x0 = load_bf16x16(row + k0, lanes(n));
    const __m512 x1 = load_bf16x16(row + k0 + 16, lanes(n - 16));
    const float amax = std::max(_mm512_reduce_max_ps(_mm512_abs_ps(x0)),
                                _mm512_reduce_max_ps(_mm512_abs_ps(x1)));
    const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    // round to nearest even, as torch.round; the products stay within ±127
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, inv));
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, inv));
    int8_t* out = q.data() + (r * blocks + b) * kBlock;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), _mm512_cvtepi32_epi8(q1));
    scale[r * blocks + b] = amax / 127.0f;
    offset[r * blocks + b] = -128 * _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
  }

  const int8_t* row_block(int64_t r, int64_t b) const {
    return q.data() + (r * blocks + b) * kBlock;
  }
};

// out[i] = the panel's 16 outputs for rows m0 .. m0 + MT of x, before the weight's scales: per
// block an exact integer dot product (vpdpbusd, 64 multiply-adds an instruction, twice
// vdpbf16ps's), times the row's block scale, summed in fp32 in block order, so a row's result
// does not depend on its batch.
template <int MT>
void panel_int8(const QuantizedRows& x, int64_t m0, const uint8_t* w, __m512* out) {
  __m512 acc[MT];
  __m512i dot[MT];
#pragma GCC unroll 16
  for (int i = 0; i < MT; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < x.blocks; ++b) {
    const int8_t* q = x.row_block(m0, b);
    const int64_t stride = x.blocks * kBlock;
#pragma GCC unroll 16
    for (int i = 0; i < MT; ++i) dot[i] = _mm512_set1_epi32(x.offset[(m0 + i) * x.blocks + b]);
#pragma GCC unroll 8
    for (int s = 0; s < kSteps; ++s) {
      const __m512i wv = _mm512_loadu_si512(w + (b * kSteps + s) * 4 * kPanel);
#pragma GCC unroll 16
      for (int i = 0; i < MT; ++i) {
        dot[i] = dot_broadcast(dot[i], wv, q + i * stride + 4 * s);
      }
    }
#pragma GCC unroll 16
    for (int i = 0; i < MT; ++i) {
      const __m512 scale = _mm512_set1_ps(x.scale[(m0 + i) * x.blocks + b]);
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i]), scale, acc[i]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MT; ++i) out[i] = acc[i];
}

using Int8PanelFn = void (*)(const QuantizedRows&, int64_t, const uint8_t*, __m512*);

Int8PanelFn int8_panel_for(int64_t rows) {
  static constexpr Int8PanelFn kPanels[] = {
      panel_int8<1>,  panel_int8<2>,  panel_int8<3>,  panel_int8<4>,
      panel_int8<5>,  panel_int8<6>,  panel_int8<7>,  panel_int8<8>,
      panel_int8<9>,  panel_int8<10>, panel_int8<11>, panel_int8<12>,
      panel_int8<13>, panel_int8<14>, panel_int8<15>, panel_int8<16>};
  return kPanels[rows - 1];
}

// Panel `p` of a bf16 packed weight (at `src`) back to its plain rows of w [N, K].
void unpack_panel(const bf16* src, bf16* w, int64_t p, int64_t n, int64_t k) {
  const int64_t pairs = (k + 1) / 2, n0 = p * kPanel, rows = std::min(kPanel, n - n0);
  int64_t j = 0;
  for (; j + 16 <= pairs && 2 * (j + 16) <= k; j += 16) {  // 16 pairs of 16 rows at once
    __m512i r[16];
    for (int t = 0; t < 16; ++t) r[t] = _mm512_loadu_si512(src + (j + t) * 2 * kPanel);
    transpose16(r);
    for (int64_t i = 0; i < rows; ++i) _mm512_storeu_si512(w + (n0 + i) * k + 2 * j, r[i]);
  }
  for (; j < pairs; ++j) {
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t e = 0; e < 2 && 2 * j + e < k; ++e) {
        w[(n0 + i) * k + 2 * j + e] = src[j * 2 * kPanel + 2 * i + e];
      }
    }
  }
}

// Runs `fn(p, n0, mask, bias)` for every output panel p (threads split them into contiguous
// ranges): n0 its first output, mask its outputs that exist, bias its 16 biases (zero without).
template <typename Fn>
void each_panel(int64_t n, const bf16* bias, Fn fn) {
  at::parallel_for(0, (n + kPanel - 1) / kPanel, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t n0 = p * kPanel;
      const __mmask16 mask = lanes(n - n0);
      fn(p, n0, mask, bias != nullptr ? load_bf16x16(bias + n0, mask) : _mm512_setzero_ps());
    }
  });
}

}  // namespace

void small_linear_int8(const bf16* x, int64_t ldx, const uint8_t* w, const float* scales,
                       const bf16* bias, bf16* y, int64_t m, int64_t n, int64_t k) {
  const QuantizedRows rows_q(x, ldx, m, k);
  const int64_t panel_size = rows_q.blocks * kBlock * kPanel;
  each_panel(n, bias, [&](int64_t p, int64_t n0, __mmask16 mask, __m512 b) {
    __m512 out[kPanel];
    const __m512 scale = _mm512_loadu_ps(scales + n0);  // padded to whole panels
    // Up to 16 x rows per pass over the panel; later passes find it in L1 or L2.
    for (int64_t m0 = 0; m0 < m; m0 += kPanel) {
      const int64_t rows = std::min(kPanel, m - m0);
      int8_panel_for(rows)(rows_q, m0, w + p * panel_size, out);
      for (int64_t i = 0; i < rows; ++i) {
        store_bf16x16(y + (m0 + i) * n + n0, mask, _mm512_fmadd_ps(out[i], scale, b));
      }
    }
  });
}

void small_linear_bf16(const bf16* x, int64_t ldx, const bf16* w, const bf16* bias, bf16* y,
                       int64_t m, int64_t n, int64_t k) {
  const int64_t panel_size = (k + 1) / 2 * 2 * kPanel;
  each_panel(n, bias, [&](int64_t p, int64_t n0, __mmask16 mask, __m512 b) {
    __m512 out[kPanel];
    // Up to 16 x rows per pass over the panel; later passes find it in L1.
    for (int64_t m0 = 0; m0 < m; m0 += kPanel) {
      const int64_t rows = std::min(kPanel, m - m0);
      const bf16* x_rows[kPanel];
      for (int64_t i = 0; i < rows; ++i) x_rows[i] = x + (m0 + i) * ldx;
      panel_for(rows)(x_rows, w + p * panel_size, k, out);
      for (int64_t i = 0; i < rows; ++i) {
        store_bf16x16(y + (m0 + i) * n + n0, mask, _mm512_add_ps(out[i], b));
      }
    }
  });
}

void unpack_weight_bf16(const bf16* packed, bf16* w, int64_t n, int64_t k) {
  const int64_t panels = (n + kPanel - 1) / kPanel, pairs = (k + 1) / 2;
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) unpack_panel(packed + p * pairs * 2 * kPanel, w, p, n, k);
  });
}

}  // namespace semantic
