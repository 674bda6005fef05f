// Rotary embeddings on a step's q and k heads in one pass, with the bits of the torch version
// in models/rope.py: out = x·cos + swap_halves(x)·sin_signed, the first product rounded to bf16
// and the sum rounded again (torch's bf16 mul, then its addcmul). The torch version is five ops
// and as many temporaries per layer; a decode step runs it in every layer.
#include <ATen/Parallel.h>

#include "kernels.h"
#include "simd.h"

namespace semantic {

void rope_bf16(const RopeProblem& p) {
  const int64_t half = p.head_dim / 2;
  at::parallel_for(0, p.tokens, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const bf16* cos = p.cos + t * p.head_dim;
      const bf16* sin = p.sin_signed + t * p.head_dim;
      for (int64_t h = 0; h < p.heads; ++h) {
        const bf16* x = p.x + t * p.token_stride + h * p.head_dim;
        bf16* out = p.out + (t * p.heads + h) * p.head_dim;
        for (int64_t i = 0; i < p.head_dim; i += 16) {
          const int64_t swapped = i < half ? i + half : i - half;
          const __m512 first =
              round_to_bf16(_mm512_mul_ps(load_bf16x16(x + i), load_bf16x16(cos + i)));
          const __m512 second = _mm512_mul_ps(load_bf16x16(x + swapped), load_bf16x16(sin + i));
          store_x16(out + i, _mm512_add_ps(first, second));
        }
      }
    }
  });
}

}  // namespace semantic
