// A step's K or V rows written into an 8-bit pool: each row (one token's one KV head) quantized
// to int8 with its own bf16 scale on the way, as backends/torch/int8.py's `quantize_rows` does
// (the same bits): scale = the row's largest |x| / 127 rounded to bf16, q = round(x / scale),
// clamped to ±127, 0 where the row is all zero. One pass over the rows instead of the dozen
// torch ops (and their temporaries) of the quantizer, per layer and step.
#include <algorithm>

#include "kernels.h"
#include "simd.h"

namespace semantic {

void write_kv_int8(const KvRows& rows, const int64_t* slots, int8_t* cache, bf16* scales) {
  const int64_t d = rows.head_dim;
  for (int64_t t = 0; t < rows.tokens; ++t) {
    for (int64_t h = 0; h < rows.kv_heads; ++h) {
      const bf16* x = rows.data + t * rows.token_stride + h * rows.head_stride;
      const int64_t row = slots[t] * rows.kv_heads + h;
      __m512 largest = _mm512_setzero_ps();
      for (int64_t c = 0; c < d; c += 16) {
        largest = _mm512_max_ps(largest, _mm512_abs_ps(load_bf16x16(x + c)));
      }
      const bf16 scale = to_bf16(_mm512_reduce_max_ps(largest) / 127.0f);
      const float divisor = bf16_to_float(scale);
      const __m512 div = _mm512_set1_ps(divisor);
      const __m512 limit = _mm512_set1_ps(127.0f);
      int8_t* out = cache + row * d;
      for (int64_t c = 0; c < d; c += 16) {
        __m512 v = divisor > 0.0f ? _mm512_div_ps(load_bf16x16(x + c), div) : _mm512_setzero_ps();
        // round to nearest even, as torch.round, then clamp as the quantizer does
        v = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        v = _mm512_min_ps(_mm512_max_ps(v, _mm512_sub_ps(_mm512_setzero_ps(), limit)), limit);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + c),
                         _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)));
      }
      scales[row] = scale;
    }
  }
}

}  // namespace semantic
