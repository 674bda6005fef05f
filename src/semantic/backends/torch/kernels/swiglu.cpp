// SwiGLU's middle, silu(gate)·up, in one pass over the fused gate-up projection's output, with
// the bits of torch's two bf16 ops (silu rounded to bf16, then the product rounded again):
// `torch.chunk`, `F.silu` and a multiply are three ops and two temporaries per layer.
#include <ATen/Parallel.h>

#include "kernels.h"
#include "simd.h"

namespace semantic {

// silu(x) = x·sigmoid(x), sigmoid from exp of a non-positive argument on both sides of zero:
// 1 / (1 + e^-x) for x >= 0, e^x / (1 + e^x) below.
inline __m512 silu(__m512 x) {
  const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(x)));
  const __m512 one = _mm512_set1_ps(1.0f);
  const __mmask16 negative = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
  const __m512 numerator = _mm512_mask_blend_ps(negative, one, e);
  return _mm512_mul_ps(x, _mm512_div_ps(numerator, _mm512_add_ps(one, e)));
}

void swiglu_bf16(const bf16* gate_up, bf16* out, int64_t tokens, int64_t inner) {
  at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const bf16* gate = gate_up + t * 2 * inner;
      const bf16* up = gate + inner;
      for (int64_t i = 0; i < inner; i += 16) {
        const __mmask16 m = lanes(inner - i);
        const __m512 act = round_to_bf16(silu(load_bf16x16(gate + i, m)));
        store_bf16x16(out + t * inner + i, m, _mm512_mul_ps(act, load_bf16x16(up + i, m)));
      }
    }
  });
}

}  // namespace semantic
