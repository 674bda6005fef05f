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

// 32 int8 weights (one input pair of 16 outputs, in the bf16 panel's order) → 32 bf16, exact:
// every int8 is a bf16. Two sign-extending loads, two int → fp32 conversions and one packing
// into bf16 pairs, whose low 16 lanes come from the second operand.
inline __m512bh load_int8_pair(const int8_t* w) {
  const __m512 lo = _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w))));
  const __m512 hi = _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 16))));
  return _mm512_cvtne2ps_pbh(hi, lo);
}

// The int8 panel's counterpart of `panel`: each weight pair is widened to bf16 in registers as
// it is read, so the weight crosses memory at one byte per value. The sums are of q·x; the
// caller scales them by the channel's scale.
template <int MT>
void panel_int8(const bf16* const* x, const int8_t* w, int64_t k, __m512* out) {
  __m512 acc[MT];
  for (int m = 0; m < MT; ++m) acc[m] = _mm512_setzero_ps();
  const int64_t pairs = k / 2;
  for (int64_t j = 0; j < pairs; ++j) {
    const __m512bh wv = load_int8_pair(w + j * 2 * kPanel);
    for (int m = 0; m < MT; ++m) {
      acc[m] = _mm512_dpbf16_ps(acc[m], broadcast_pair(x[m] + 2 * j), wv);
    }
  }
  if (k % 2 != 0) {
    const __m512bh wv = load_int8_pair(w + pairs * 2 * kPanel);
    for (int m = 0; m < MT; ++m) {
      acc[m] = _mm512_dpbf16_ps(acc[m], (__m512bh)_mm512_set1_epi32(x[m][k - 1]), wv);
    }
  }
  for (int m = 0; m < MT; ++m) out[m] = acc[m];
}

using Int8PanelFn = void (*)(const bf16* const*, const int8_t*, int64_t, __m512*);

Int8PanelFn int8_panel_for(int64_t rows) {
  static constexpr Int8PanelFn kPanels[] = {
      panel_int8<1>,  panel_int8<2>,  panel_int8<3>,  panel_int8<4>,
      panel_int8<5>,  panel_int8<6>,  panel_int8<7>,  panel_int8<8>,
      panel_int8<9>,  panel_int8<10>, panel_int8<11>, panel_int8<12>,
      panel_int8<13>, panel_int8<14>, panel_int8<15>, panel_int8<16>};
  return kPanels[rows - 1];
}

// One int8 panel widened to bf16 into `out`, the bf16 panel's layout: more than 16 rows then
// run the bf16 panel over it from L1/L2 instead of widening it once per pass.
void widen_panel(const int8_t* w, int64_t pairs, bf16* out) {
  for (int64_t j = 0; j < pairs; ++j) {
    _mm512_storeu_si512(out + j * 2 * kPanel, (__m512i)load_int8_pair(w + j * 2 * kPanel));
  }
}

// The same, each value times its output's scale and rounded once to bf16: the weight itself.
void dequantize_panel(const int8_t* w, const float* scales, int64_t pairs, bf16* out) {
  // Lane l of a pair's low (high) 16 values belongs to output l / 2 (8 + l / 2).
  const __m512i twice = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const __m512 s = _mm512_loadu_ps(scales);
  const __m512 s_lo = _mm512_permutexvar_ps(twice, s);
  const __m512 s_hi = _mm512_permutexvar_ps(_mm512_add_epi32(twice, _mm512_set1_epi32(8)), s);
  for (int64_t j = 0; j < pairs; ++j) {
    const int8_t* q = w + j * 2 * kPanel;
    const __m512 lo = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))));
    const __m512 hi = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16))));
    const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_mul_ps(hi, s_hi), _mm512_mul_ps(lo, s_lo));
    _mm512_storeu_si512(out + j * 2 * kPanel, (__m512i)v);
  }
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

}  // namespace

void small_linear_int8(const bf16* x, int64_t ldx, const int8_t* w, const float* scales,
                       const bf16* bias, bf16* y, int64_t m, int64_t n, int64_t k) {
  const int64_t panels = (n + kPanel - 1) / kPanel, pairs = (k + 1) / 2;
  const int64_t panel_size = pairs * 2 * kPanel;
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    __m512 out[kPanel];
    std::vector<bf16> wide(m > kPanel ? panel_size : 0);
    for (int64_t p = begin; p < end; ++p) {
      const int64_t n0 = p * kPanel, cols = std::min(kPanel, n - n0);
      const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1);
      const __m512 b = bias != nullptr ? load_bf16x16(bias + n0, mask) : _mm512_setzero_ps();
      const __m512 scale = _mm512_loadu_ps(scales + n0);  // padded to whole panels
      const int8_t* panel_w = w + p * panel_size;
      if (m > kPanel) widen_panel(panel_w, pairs, wide.data());
      for (int64_t m0 = 0; m0 < m; m0 += kPanel) {
        const int64_t rows = std::min(kPanel, m - m0);
        const bf16* x_rows[kPanel];
        for (int64_t i = 0; i < rows; ++i) x_rows[i] = x + (m0 + i) * ldx;
        if (m > kPanel) {
          panel_for(rows)(x_rows, wide.data(), k, out);
        } else {
          int8_panel_for(rows)(x_rows, panel_w, k, out);
        }
        for (int64_t i = 0; i < rows; ++i) {
          const __m256i v = (__m256i)_mm512_cvtneps_pbh(_mm512_fmadd_ps(out[i], scale, b));
          _mm256_mask_storeu_epi16(y + (m0 + i) * n + n0, mask, v);
        }
      }
    }
  });
}

void unpack_weight_int8(const int8_t* packed, const float* scales, bf16* w, int64_t n,
                        int64_t k) {
  const int64_t panels = (n + kPanel - 1) / kPanel, pairs = (k + 1) / 2;
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    std::vector<bf16> panel(pairs * 2 * kPanel);
    for (int64_t p = begin; p < end; ++p) {
      dequantize_panel(packed + p * pairs * 2 * kPanel, scales + p * kPanel, pairs, panel.data());
      unpack_panel(panel.data(), w, p, n, k);
    }
  });
}

void small_linear_bf16(const bf16* x, int64_t ldx, const bf16* w, const bf16* bias, bf16* y,
                       int64_t m, int64_t n, int64_t k) {
  const int64_t panels = (n + kPanel - 1) / kPanel, panel_size = (k + 1) / 2 * 2 * kPanel;
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    __m512 out[kPanel];
    for (int64_t p = begin; p < end; ++p) {
      const int64_t n0 = p * kPanel, cols = std::min(kPanel, n - n0);
      const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1);
      const __m512 b = bias != nullptr ? load_bf16x16(bias + n0, mask) : _mm512_setzero_ps();
      // Up to 16 x rows per pass over the panel; later passes find it in L1.
      for (int64_t m0 = 0; m0 < m; m0 += kPanel) {
        const int64_t rows = std::min(kPanel, m - m0);
        const bf16* x_rows[kPanel];
        for (int64_t i = 0; i < rows; ++i) x_rows[i] = x + (m0 + i) * ldx;
        panel_for(rows)(x_rows, w + p * panel_size, k, out);
        for (int64_t i = 0; i < rows; ++i) {
          const __m256i v = (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(out[i], b));
          _mm256_mask_storeu_epi16(y + (m0 + i) * n + n0, mask, v);
        }
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
