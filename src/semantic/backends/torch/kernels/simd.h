// AVX-512 building blocks shared by the CPU kernels: bf16 <-> fp32, exp, 16-way reductions.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace semantic {

using bf16 = uint16_t;  // raw bits; torch's c10::BFloat16 stays out of the kernel files

// 16 bf16 -> 16 fp32: a bf16 is the top half of an fp32.
inline __m512 load_bf16x16(const bf16* p) {
  __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

inline __m512 load_bf16x16(const bf16* p, __mmask16 mask) {
  __m256i raw = _mm256_maskz_loadu_epi16(mask, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

inline __m512 load_x16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load_x16(const bf16* p) { return load_bf16x16(p); }

// An 8-bit KV row's pieces: 16 int8 -> 16 fp32 (exact), and its bf16 scale as fp32.
inline __m512 load_i8x16(const int8_t* p) {
  __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(raw));
}

inline float bf16_to_float(bf16 b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

// fp32 -> bf16, round to nearest even (NaN stays NaN).
inline bf16 to_bf16(float f) {
  uint32_t bits;
  __builtin_memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<bf16>(bits >> 16);
}

// fp32 -> the nearest bf16 (even on a tie) -> fp32: a torch bf16 op's rounding of its result.
inline __m512 round_to_bf16(__m512 v) {
  const __m256i b = (__m256i)_mm512_cvtneps_pbh(v);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}

// The first `left` of 16 lanes (none for left <= 0, all for left >= 16): a row's last, partial
// vector.
inline __mmask16 lanes(int64_t left) {
  if (left <= 0) return 0;
  return left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}

// 16 fp32 rounded to bf16 into the lanes of `m`.
inline void store_bf16x16(bf16* p, __mmask16 m, __m512 v) {
  _mm256_mask_storeu_epi16(p, m, (__m256i)_mm512_cvtneps_pbh(v));
}

inline void store_x16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
inline void store_x16(bf16* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)_mm512_cvtneps_pbh(v));
}

// dot + the 16 lanes' byte dot products (vpdpbusd: u's unsigned bytes, 4 a lane, against the
// signed 4 bytes at q, the same for every lane), q broadcast from memory by the instruction
// itself ({1to16}): GCC loads set1's broadcast into a register of its own first, an instruction
// more for every dot product (up to 10% slower a call at a few rows, measured).
inline __m512i dot_broadcast(__m512i dot, __m512i u, const int8_t* q) {
  asm("vpdpbusd %2%{1to16%}, %1, %0"
      : "+v"(dot)
      : "v"(u), "m"(*reinterpret_cast<const int32_t*>(q)));
  return dot;
}

// dot + the 16 lanes' int16 pair dot products (vpdpwssd: v's pairs against the pair at w, the
// same for every lane), w broadcast from memory by the instruction itself, as dot_broadcast's.
inline __m512i pair_dot_broadcast(__m512i dot, __m512i v, const int16_t* w) {
  asm("vpdpwssd %2%{1to16%}, %1, %0"
      : "+v"(dot)
      : "v"(v), "m"(*reinterpret_cast<const int32_t*>(w)));
  return dot;
}

// exp(x) for x <= 0 (scores minus their max); -inf and anything below -87 give 0.
inline __m512 exp_nonpositive(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.0f);
  __mmask16 tiny = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  x = _mm512_max_ps(x, lo);
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  // exp(r) on |r| <= ln2/2: degree-6 Taylor, relative error < 2e-7.
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~tiny), _mm512_scalef_ps(p, n));
}

// 16 vectors -> one vector whose lane i is the sum of v[i]'s lanes: a transposing add tree,
// ~3 instructions per sum instead of a full horizontal reduction each.
inline __m512 hsum16(const __m512* v) {
  __m512 s[8], r[4], x[2];
  for (int i = 0; i < 8; ++i) {  // per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3]
    s[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  }
  for (int i = 0; i < 4; ++i) {  // per 128-bit lane: one partial sum of each of 4 vectors
    r[i] = _mm512_add_ps(_mm512_shuffle_ps(s[2 * i], s[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(s[2 * i], s[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  for (int i = 0; i < 2; ++i) {  // fold the four 128-bit lanes pairwise
    x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(r[2 * i], r[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(r[2 * i], r[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  }
  return _mm512_add_ps(_mm512_shuffle_f32x4(x[0], x[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(x[0], x[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

}  // namespace semantic
