// The CPU kernels' entry points over raw pointers; bindings.cpp checks tensors and calls these.
#pragma once

#include <cstdint>

#include "simd.h"

namespace semantic {

// Paged decode attention: one query token per sequence against its K/V blocks, read in place.
struct DecodeProblem {
  const void* q;  // [B, H, D], D contiguous
  int64_t q_stride_b, q_stride_h;
  const void* k_cache;  // [num_blocks, block_tokens, KVH, D], contiguous
  const void* v_cache;
  const int64_t* block_tables;  // [B, table_stride]
  int64_t table_stride;
  const int64_t* context_lens;  // [B]
  int64_t batch, heads, kv_heads, head_dim, block_tokens;
  float scale;
  void* out;  // [B, H, D], contiguous
  int64_t window;      // > 0: each query reads only its last `window` keys (a sliding layer)
  const float* sinks;  // [H] or null: one more logit per head in the softmax, with no value
  // An 8-bit cache: the caches are int8 and each row's value is its integers times its scale,
  // [num_blocks, block_tokens, KVH] bf16. Null: the caches hold q's dtype.
  const bf16* k_scales = nullptr;
  const bf16* v_scales = nullptr;
};

bool decode_supported(int64_t head_dim, int64_t heads);
void paged_decode_f32(const DecodeProblem& p);
void paged_decode_bf16(const DecodeProblem& p);

// Where token j's K (or V) row of KV head h lies: base + table[j / block_tokens] · block_stride
// + (j % block_tokens) · token_stride + h · head_stride elements, D contiguous. A null table is
// one block: the chunk's own K/V, not yet in a pool.
// With `scales` (an 8-bit pool: int8 rows), the row's scale is at table[...] · scale_block_stride
// + (j % block_tokens) · scale_token_stride + h.
struct PagedRows {
  const void* base;
  const int64_t* table;
  int64_t block_tokens, block_stride, token_stride, head_stride;
  const bf16* scales = nullptr;
  int64_t scale_block_stride = 0, scale_token_stride = 0;
};

// Paged prefill attention: a chunk's n queries at positions context_len.. against the sequence's
// keys 0 .. context_len + n - 1, causal, read in place through the block table.
struct PrefillProblem {
  const void* q;  // [n, H, D], D contiguous
  int64_t q_stride_t, q_stride_h;
  PagedRows k, v;
  int64_t context_len, n, heads, kv_heads, head_dim;
  float scale;
  void* out;  // [n, H, D], contiguous
  int64_t window;      // > 0: the query at position p reads keys p - window + 1 .. p only
  const float* sinks;  // [H] or null: one more logit per head in the softmax, with no value
};

bool prefill_supported(int64_t head_dim);
void paged_prefill_f32(const PrefillProblem& p);
void paged_prefill_bf16(const PrefillProblem& p);

// y[M, N] = x[M, K] · wᵀ (+ bias), bf16 in and out, fp32 accumulation, M small; w packed in
// panels of 16 rows, [ceil(N/16)][ceil(K/2)][16][2] (see small_linear.cpp).
void small_linear_bf16(const bf16* x, int64_t ldx, const bf16* w, const bf16* bias, bf16* y,
                       int64_t m, int64_t n, int64_t k);
// The packed weight back to plain rows, w [N, K].
void unpack_weight_bf16(const bf16* packed, bf16* w, int64_t n, int64_t k);

// The same over an 8-bit weight: one byte a value (the int8 value + 128),
// [ceil(N/16)][Kp/4][16][4] with Kp = K rounded up to 32, and a scale per output (fp32, padded
// to whole panels); x is quantized to int8 per block of 32 values, and y = Σ over blocks of
// (qx · qwᵀ) · x's block scale, times the weight's scale, + bias (see small_linear.cpp).
void small_linear_int8(const bf16* x, int64_t ldx, const uint8_t* w, const float* scales,
                       const bf16* bias, bf16* y, int64_t m, int64_t n, int64_t k);

// The same over a weight in quantized groups of 32 inputs, as a GGUF's Q4_K or Q5_K blocks
// (`scale · u − min`, u in 4 or 5 bits, or in 8: the byte form) or Q6_K blocks (`scale · (u − 32)` per 16, u in
// 6 bits) hold them, in 16-row panels (block_linear.cpp); x is quantized to int8 a step per
// kBlockSuper inputs, finer for small groups of 32. K is a multiple of kBlockSuper.
constexpr int64_t kBlockSuper = 256;  // inputs per d and dmin
struct BlockWeight {
  const uint8_t* values;  // [P][K/32][planes][16][4]: 4 (Q4_K), 5 (Q5_K), 6 (Q6_K), 8 (bytes)
  const uint8_t* codes;   // [P][K/32][2][16]: sc, m (Q6_K: each half's sc)
  const float* supers;    // [P][K/256][2][16]: d, dmin
  int planes;
};
void block_linear(const bf16* x, int64_t ldx, const BlockWeight& w, const bf16* bias, bf16* y,
                  int64_t m, int64_t n, int64_t k);

// The same over a GGUF's per-32 blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): each group of 32 inputs
// of an output is `d · (u − offset) + m`, d and m fp16 of its own; K is a multiple of 32.
struct FlatWeight {
  const uint8_t* values;    // [P][K/32][planes][16][4]: planes 4 (nibbles), 5 (Q5) or 8 (bytes)
  const uint16_t* factors;  // [P][K/32][1 or 2][16] fp16: d, then m where `affine`
  int planes;
  int32_t offset;  // 8 (Q4_0), 16 (Q5_0), 128 (bytes, Q8_0's u = q + 128) or 0 (affine)
  bool affine;
};
void flat_linear(const bf16* x, int64_t ldx, const FlatWeight& w, const bf16* bias, bf16* y,
                 int64_t m, int64_t n, int64_t k);

// A step's K or V for an 8-bit pool: [tokens, kv_heads, head_dim] bf16 rows (head_dim a
// multiple of 16), each written quantized to the pool row of its slot and KV head.
struct KvRows {
  const bf16* data;
  int64_t tokens, kv_heads, head_dim;
  int64_t token_stride, head_stride;  // elements
};
// cache: int8 [slots][kv_heads][head_dim]; scales: bf16 [slots][kv_heads] (kv_write.cpp).
void write_kv_int8(const KvRows& rows, const int64_t* slots, int8_t* cache, bf16* scales);

// Rotary embeddings: out[t, h] = x[t, h]·cos[t] + swap_halves(x[t, h])·sin_signed[t], bf16,
// each product and the sum rounded as torch's bf16 ops round them (rope.cpp).
struct RopeProblem {
  const bf16* x;  // [tokens, heads, head_dim], heads contiguous within a token
  int64_t token_stride;
  const bf16* cos;         // [tokens, head_dim]
  const bf16* sin_signed;  // [tokens, head_dim]: [-sin, sin]
  bf16* out;               // [tokens, heads, head_dim], contiguous
  int64_t tokens, heads, head_dim;  // head_dim a multiple of 32
};
void rope_bf16(const RopeProblem& p);

// out[t] = silu(gate_up[t, :inner]) · gate_up[t, inner:], bf16, silu rounded first (swiglu.cpp).
void swiglu_bf16(const bf16* gate_up, bf16* out, int64_t tokens, int64_t inner);

// y[r] = RMSNorm(x[r]) * w for `rows` rows of d elements (y contiguous); bf16 rounds the
// normalised row before scaling it where `round_normed` (Llama), after only otherwise (Gemma).
void rms_norm_bf16(const bf16* x, int64_t ldx, const bf16* w, bf16* y, int64_t rows, int64_t d,
                   float eps, bool round_normed);
void rms_norm_f32(const float* x, int64_t ldx, const float* w, float* y, int64_t rows, int64_t d,
                  float eps);

}  // namespace semantic
