// Python bindings of the CPU kernels: tensor checks here, arithmetic in the kernel files.
// Narrow includes, not <torch/extension.h>: it quadruples the compile time (~45 s vs ~12 s).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "kernels.h"

namespace {

using semantic::bf16;

void check_cpu(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
}

// The sink logits' data, checked: a contiguous float32 [heads]; null without sinks.
const float* sink_logits(const std::optional<at::Tensor>& sinks, int64_t heads) {
  if (!sinks.has_value()) return nullptr;
  check_cpu(*sinks, "sinks");
  TORCH_CHECK(sinks->scalar_type() == at::kFloat && sinks->is_contiguous() && sinks->dim() == 1 &&
                  sinks->numel() == heads,
              "sinks must be a contiguous float32 [H]");
  return sinks->data_ptr<float>();
}

// An 8-bit pool's row scales, checked: null unless the caches are int8, and then a contiguous
// bfloat16 [blocks, tokens, KVH] of K's and of V's.
std::pair<const bf16*, const bf16*> row_scales(const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& v,
                                               const std::optional<at::Tensor>& k_scales,
                                               const std::optional<at::Tensor>& v_scales) {
  TORCH_CHECK(k.scalar_type() == v.scalar_type(), "K and V must share a dtype");
  if (k.scalar_type() != at::kChar) {
    TORCH_CHECK(q.scalar_type() == k.scalar_type(), "q and the caches must share a dtype");
    TORCH_CHECK(!k_scales.has_value() && !v_scales.has_value(), "scales need int8 caches");
    return {nullptr, nullptr};
  }
  TORCH_CHECK(k_scales.has_value() && v_scales.has_value(), "int8 caches need their scales");
  for (const at::Tensor* t : {&*k_scales, &*v_scales}) {
    check_cpu(*t, "scales");
    TORCH_CHECK(t->scalar_type() == at::kBFloat16 && t->is_contiguous() && t->dim() == 3 &&
                    t->sizes() == k.sizes().slice(0, 3),
                "scales must be a contiguous bfloat16 [blocks, tokens, KVH]");
  }
  return {static_cast<const bf16*>(k_scales->data_ptr()),
          static_cast<const bf16*>(v_scales->data_ptr())};
}

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache,
                                  const at::Tensor& v_cache, const at::Tensor& block_tables,
                                  const at::Tensor& context_lens, double scale, int64_t window,
                                  const std::optional<at::Tensor>& sinks,
                                  const std::optional<at::Tensor>& k_scales,
                                  const std::optional<at::Tensor>& v_scales) {
  for (const auto* t : {&q, &k_cache, &v_cache, &block_tables, &context_lens}) check_cpu(*t, "input");
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4, "q [B, H, D], caches [blocks, tokens, KVH, D]");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes(), "K and V caches differ in shape");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous");
  const auto [k_scale_ptr, v_scale_ptr] = row_scales(q, k_cache, v_cache, k_scales, v_scales);
  TORCH_CHECK(q.stride(2) == 1, "q's head_dim must be contiguous");
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t kv_heads = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == dim && semantic::decode_supported(dim, heads),
              "unsupported head_dim ", dim, " or head count ", heads);
  TORCH_CHECK(heads % kv_heads == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(window >= 0, "the window must be 0 (none) or positive");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && context_lens.scalar_type() == at::kLong,
              "block tables and context lengths must be int64");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == batch &&
                  block_tables.stride(1) == 1 && context_lens.numel() == batch &&
                  context_lens.is_contiguous(),
              "block tables [B, max_blocks], context lengths [B]");
  const int64_t* lens = context_lens.data_ptr<int64_t>();
  TORCH_CHECK(std::all_of(lens, lens + batch,
                          [&](int64_t n) { return n >= 0 && n <= block_tables.size(1) * k_cache.size(1); }),
              "a context is longer than its block table covers");
  const int64_t num_blocks = k_cache.size(0), block_tokens = k_cache.size(1);
  for (int64_t b = 0; b < batch; ++b) {  // every block a context reads lies in the cache
    const int64_t* table = block_tables.data_ptr<int64_t>() + b * block_tables.stride(0);
    const int64_t used = (lens[b] + block_tokens - 1) / block_tokens;
    TORCH_CHECK(std::all_of(table, table + used, [&](int64_t id) { return id >= 0 && id < num_blocks; }),
                "block table of sequence ", b, " names a block outside the cache");
  }
  at::Tensor out = at::empty({batch, heads, dim}, q.options());
  semantic::DecodeProblem p{q.data_ptr(),          q.stride(0),         q.stride(1),
                            k_cache.data_ptr(),    v_cache.data_ptr(),  block_tables.data_ptr<int64_t>(),
                            block_tables.stride(0), context_lens.data_ptr<int64_t>(),
                            batch,                 heads,               kv_heads,
                            dim,                   k_cache.size(1),     static_cast<float>(scale),
                            out.data_ptr(),        window,              sink_logits(sinks, heads),
                            k_scale_ptr,           v_scale_ptr};
  if (q.scalar_type() == at::kBFloat16) {
    semantic::paged_decode_bf16(p);
  } else {
    TORCH_CHECK(q.scalar_type() == at::kFloat, "q must be bfloat16 or float32");
    semantic::paged_decode_f32(p);
  }
  return out;
}

// K or V as the kernel reads it: a pool [blocks, block_tokens, KVH, D] through `table`, or the
// chunk's own [n, KVH, D] (any token stride) as one block.
semantic::PagedRows paged_rows(const at::Tensor& t, const int64_t* table,
                               const bf16* scales = nullptr) {
  if (table != nullptr) {
    return {t.data_ptr(), table,   t.size(1), t.stride(0), t.stride(1), t.stride(2),
            scales,       t.size(1) * t.size(2), t.size(2)};
  }
  return {t.data_ptr(), nullptr, std::max<int64_t>(t.size(0), 1), 0, t.stride(0), t.stride(1)};
}

at::Tensor paged_prefill_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const std::optional<at::Tensor>& block_table,
                                   int64_t context_len, double scale, int64_t window,
                                   const std::optional<at::Tensor>& sinks,
                                   const std::optional<at::Tensor>& k_scales,
                                   const std::optional<at::Tensor>& v_scales) {
  for (const auto* t : {&q, &k, &v}) check_cpu(*t, "input");
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1, "q must be [n, H, D], D contiguous");
  TORCH_CHECK(k.sizes() == v.sizes(), "K and V differ in shape");
  TORCH_CHECK(k.scalar_type() != at::kChar || (block_table.has_value() && k.is_contiguous() &&
                                               v.is_contiguous()),
              "int8 K and V are contiguous pools read through a block table");
  const auto [k_scale_ptr, v_scale_ptr] = row_scales(q, k, v, k_scales, v_scales);
  const int64_t n = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t kv_heads = k.size(-2), total = context_len + n;
  TORCH_CHECK(k.size(-1) == dim && semantic::prefill_supported(dim), "unsupported head_dim ", dim);
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(k.stride(-1) == 1 && v.stride(-1) == 1, "K and V rows must be contiguous");
  TORCH_CHECK(window >= 0, "the window must be 0 (none) or positive");
  const int64_t* table = nullptr;
  if (block_table.has_value()) {
    const at::Tensor& ids = *block_table;
    check_cpu(ids, "block table");
    TORCH_CHECK(k.dim() == 4, "with a block table, k and v are pools [blocks, tokens, KVH, D]");
    TORCH_CHECK(ids.scalar_type() == at::kLong && ids.dim() == 1 && ids.is_contiguous(),
                "the block table must be a contiguous int64 [m]");
    TORCH_CHECK(context_len >= 0 && ids.numel() * k.size(1) >= total,
                "the block table covers fewer tokens than context and chunk");
    table = ids.data_ptr<int64_t>();
    const int64_t used = (total + k.size(1) - 1) / k.size(1), blocks = k.size(0);
    TORCH_CHECK(std::all_of(table, table + used, [&](int64_t id) { return id >= 0 && id < blocks; }),
                "the block table names a block outside the cache");
  } else {
    TORCH_CHECK(k.dim() == 3 && k.size(0) == n && context_len == 0,
                "without a block table, k and v are the chunk's own [n, KVH, D] and no context");
  }
  at::Tensor out = at::empty({n, heads, dim}, q.options());
  if (n == 0) return out;
  semantic::PrefillProblem p{q.data_ptr(),          q.stride(0), q.stride(1),
                             paged_rows(k, table, k_scale_ptr),
                             paged_rows(v, table, v_scale_ptr),
                             context_len,           n,           heads,
                             kv_heads,              dim,         static_cast<float>(scale),
                             out.data_ptr(),        window,      sink_logits(sinks, heads)};
  if (q.scalar_type() == at::kBFloat16) {
    semantic::paged_prefill_bf16(p);
  } else {
    TORCH_CHECK(q.scalar_type() == at::kFloat, "q must be bfloat16 or float32");
    semantic::paged_prefill_f32(p);
  }
  return out;
}

// The packed weight [ceil(N/16), ceil(K/2), 16, 2] of a plain [N, K] one.
void check_packed(const at::Tensor& packed, int64_t n, int64_t k) {
  check_cpu(packed, "weight");
  TORCH_CHECK(packed.scalar_type() == at::kBFloat16 && packed.is_contiguous(),
              "the packed weight must be contiguous bfloat16");
  TORCH_CHECK(packed.dim() == 4 && packed.size(0) == (n + 15) / 16 && packed.size(1) == (k + 1) / 2 &&
                  packed.size(2) == 16 && packed.size(3) == 2,
              "the packed weight must be [ceil(N/16), ceil(K/2), 16, 2]");
}

// A small-row linear's input: bf16 [M, K] with contiguous rows.
void check_linear_input(const at::Tensor& x) {
  check_cpu(x, "x");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.stride(1) == 1,
              "x must be bfloat16 [M, K] with contiguous rows");
}

// The bias's data, checked as a contiguous bf16 [N]; null where there is none.
const bf16* bias_of(const std::optional<at::Tensor>& bias, int64_t n) {
  if (!bias.has_value()) return nullptr;
  TORCH_CHECK(bias->scalar_type() == at::kBFloat16 && bias->numel() == n && bias->is_contiguous(),
              "bias must be a contiguous bfloat16 [N]");
  return static_cast<const bf16*>(bias->data_ptr());
}

at::Tensor small_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n,
                        const std::optional<at::Tensor>& bias) {
  check_linear_input(x);
  const int64_t m = x.size(0), k = x.size(1);
  check_packed(packed, n, k);
  const bf16* bias_ptr = bias_of(bias, n);
  at::Tensor y = at::empty({m, n}, x.options());
  if (m > 0 && n > 0) {
    semantic::small_linear_bf16(static_cast<const bf16*>(x.data_ptr()), x.stride(0),
                                static_cast<const bf16*>(packed.data_ptr()), bias_ptr,
                                static_cast<bf16*>(y.data_ptr()), m, n, k);
  }
  return y;
}

void unpack_weight(const at::Tensor& packed, at::Tensor& out) {
  check_cpu(out, "out");
  TORCH_CHECK(out.scalar_type() == at::kBFloat16 && out.dim() == 2 && out.is_contiguous(),
              "out must be a contiguous bfloat16 [N, K]");
  const int64_t n = out.size(0), k = out.size(1);
  check_packed(packed, n, k);
  semantic::unpack_weight_bf16(static_cast<const bf16*>(packed.data_ptr()),
                               static_cast<bf16*>(out.data_ptr()), n, k);
}

// The 8-bit packed weight [ceil(N/16), Kp/4, 16, 4] (Kp = K rounded up to 32) of a plain
// [N, K] one, and its fp32 scales, one per output padded to whole panels [16 · ceil(N/16)].
void check_int8_packed(const at::Tensor& packed, const at::Tensor& scales, int64_t n, int64_t k) {
  check_cpu(packed, "weight");
  check_cpu(scales, "scales");
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous(),
              "the 8-bit packed weight must be contiguous uint8");
  TORCH_CHECK(packed.dim() == 4 && packed.size(0) == (n + 15) / 16 &&
                  packed.size(1) == (k + 31) / 32 * 8 && packed.size(2) == 16 && packed.size(3) == 4,
              "the 8-bit packed weight must be [ceil(N/16), ceil(K/32) * 8, 16, 4]");
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous() &&
                  scales.numel() == packed.size(0) * 16,
              "the scales must be a contiguous float32 [16 * ceil(N/16)]");
}

at::Tensor small_linear_int8(const at::Tensor& x, const at::Tensor& packed,
                             const at::Tensor& scales, int64_t n,
                             const std::optional<at::Tensor>& bias) {
  check_linear_input(x);
  const int64_t m = x.size(0), k = x.size(1);
  check_int8_packed(packed, scales, n, k);
  const bf16* bias_ptr = bias_of(bias, n);
  at::Tensor y = at::empty({m, n}, x.options());
  if (m > 0 && n > 0) {
    semantic::small_linear_int8(static_cast<const bf16*>(x.data_ptr()), x.stride(0),
                                packed.data_ptr<uint8_t>(), scales.data_ptr<float>(), bias_ptr,
                                static_cast<bf16*>(y.data_ptr()), m, n, k);
  }
  return y;
}

// A weight in quantized groups (kernels.h `BlockWeight`), checked against x's K and the outputs
// n: values [P, K/32, 4 (Q4_K), 5 (Q5_K), 6 (Q6_K) or 8 (bytes), 16, 4] uint8, codes [P, K/32,
// 2, 16] uint8, supers [P, K/256, 2, 16] float32, all contiguous, P = ceil(n/16).
semantic::BlockWeight block_weight(const at::Tensor& values, const at::Tensor& codes,
                                   const at::Tensor& supers, int64_t n, int64_t k) {
  check_cpu(values, "values");
  check_cpu(codes, "codes");
  check_cpu(supers, "supers");
  const int64_t panels = (n + 15) / 16, groups = k / 32;
  TORCH_CHECK(k % semantic::kBlockSuper == 0, "K must be a multiple of 256, not ", k);
  const int64_t planes = values.dim() == 5 ? values.size(2) : 0;
  TORCH_CHECK(values.scalar_type() == at::kByte && values.is_contiguous() && values.dim() == 5 &&
                  values.size(0) == panels && values.size(1) == groups &&
                  (planes == 4 || planes == 5 || planes == 6 || planes == 8) &&
                  values.size(3) == 16 && values.size(4) == 4,
              "the values must be a contiguous uint8 [ceil(N/16), K/32, 4, 5, 6 or 8, 16, 4]");
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.is_contiguous() &&
                  codes.sizes() == at::IntArrayRef({panels, groups, 2, 16}),
              "the codes must be a contiguous uint8 [ceil(N/16), K/32, 2, 16]");
  TORCH_CHECK(supers.scalar_type() == at::kFloat && supers.is_contiguous() &&
                  supers.sizes() == at::IntArrayRef({panels, k / semantic::kBlockSuper, 2, 16}),
              "the supers must be a contiguous float32 [ceil(N/16), K/256, 2, 16]");
  return {values.data_ptr<uint8_t>(), codes.data_ptr<uint8_t>(), supers.data_ptr<float>(),
          static_cast<int>(values.size(2))};
}

at::Tensor block_linear(const at::Tensor& x, const at::Tensor& values, const at::Tensor& codes,
                        const at::Tensor& supers, int64_t n,
                        const std::optional<at::Tensor>& bias) {
  check_linear_input(x);
  const int64_t m = x.size(0), k = x.size(1);
  const semantic::BlockWeight w = block_weight(values, codes, supers, n, k);
  const bf16* bias_ptr = bias_of(bias, n);
  at::Tensor y = at::empty({m, n}, x.options());
  if (m > 0 && n > 0) {
    semantic::block_linear(static_cast<const bf16*>(x.data_ptr()), x.stride(0), w, bias_ptr,
                           static_cast<bf16*>(y.data_ptr()), m, n, k);
  }
  return y;
}

// A weight in per-32 blocks (kernels.h `FlatWeight`), checked against x's K and the outputs n:
// values [P, K/32, 4, 5 or 8, 16, 4] uint8, factors [P, K/32, 1 or 2, 16] float16, contiguous.
semantic::FlatWeight flat_weight(const at::Tensor& values, const at::Tensor& factors,
                                 int64_t offset, int64_t n, int64_t k) {
  check_cpu(values, "values");
  check_cpu(factors, "factors");
  const int64_t panels = (n + 15) / 16, groups = k / 32;
  TORCH_CHECK(k % 32 == 0, "K must be a multiple of 32, not ", k);
  TORCH_CHECK(values.scalar_type() == at::kByte && values.is_contiguous() && values.dim() == 5 &&
                  values.size(0) == panels && values.size(1) == groups &&
                  (values.size(2) == 4 || values.size(2) == 5 || values.size(2) == 8) &&
                  values.size(3) == 16 && values.size(4) == 4,
              "the values must be a contiguous uint8 [ceil(N/16), K/32, 4, 5 or 8, 16, 4]");
  TORCH_CHECK(factors.scalar_type() == at::kHalf && factors.is_contiguous() &&
                  factors.dim() == 4 && factors.size(0) == panels && factors.size(1) == groups &&
                  (factors.size(2) == 1 || factors.size(2) == 2) && factors.size(3) == 16,
              "the factors must be a contiguous float16 [ceil(N/16), K/32, 1 or 2, 16]");
  TORCH_CHECK(offset >= 0 && offset <= 128, "the offset must be in 0..128");
  return {values.data_ptr<uint8_t>(), static_cast<const uint16_t*>(factors.data_ptr()),
          static_cast<int>(values.size(2)), static_cast<int32_t>(offset), factors.size(2) == 2};
}

at::Tensor flat_linear(const at::Tensor& x, const at::Tensor& values, const at::Tensor& factors,
                       int64_t offset, int64_t n, const std::optional<at::Tensor>& bias) {
  check_linear_input(x);
  const int64_t m = x.size(0), k = x.size(1);
  const semantic::FlatWeight w = flat_weight(values, factors, offset, n, k);
  const bf16* bias_ptr = bias_of(bias, n);
  at::Tensor y = at::empty({m, n}, x.options());
  if (m > 0 && n > 0) {
    semantic::flat_linear(static_cast<const bf16*>(x.data_ptr()), x.stride(0), w, bias_ptr,
                          static_cast<bf16*>(y.data_ptr()), m, n, k);
  }
  return y;
}

void write_kv_int8(const at::Tensor& x, const at::Tensor& slots, at::Tensor& cache,
                   at::Tensor& scales) {
  for (const at::Tensor& t : {x, slots, cache, scales}) check_cpu(t, "input");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 3 && x.stride(2) == 1,
              "x must be bfloat16 [T, KVH, D] with contiguous rows");
  TORCH_CHECK(cache.scalar_type() == at::kChar && cache.is_contiguous() && cache.dim() == 4 &&
                  cache.size(2) == x.size(1) && cache.size(3) == x.size(2),
              "the cache must be a contiguous int8 [blocks, tokens, KVH, D] of x's heads");
  TORCH_CHECK(scales.scalar_type() == at::kBFloat16 && scales.is_contiguous() &&
                  scales.sizes() == cache.sizes().slice(0, 3),
              "the scales must be a contiguous bfloat16 [blocks, tokens, KVH]");
  TORCH_CHECK(x.size(2) % 16 == 0, "head_dim must be a multiple of 16");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.is_contiguous() && slots.dim() == 1 &&
                  slots.size(0) == x.size(0),
              "slots must be a contiguous int64 [T]");
  const int64_t* slot = slots.data_ptr<int64_t>();
  const int64_t capacity = cache.size(0) * cache.size(1);
  TORCH_CHECK(std::all_of(slot, slot + slots.size(0),
                          [&](int64_t s) { return s >= 0 && s < capacity; }),
              "a slot lies outside the cache");
  const semantic::KvRows rows{static_cast<const bf16*>(x.data_ptr()), x.size(0), x.size(1),
                              x.size(2), x.stride(0), x.stride(1)};
  semantic::write_kv_int8(rows, slot, cache.data_ptr<int8_t>(),
                          static_cast<bf16*>(scales.data_ptr()));
}

at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin_signed) {
  for (const at::Tensor& t : {x, cos, sin_signed}) check_cpu(t, "input");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 3 && x.stride(2) == 1 &&
                  x.stride(1) == x.size(2),
              "x must be bfloat16 [T, N, D] with each token's heads contiguous");
  const int64_t tokens = x.size(0), dim = x.size(2);
  TORCH_CHECK(dim % 32 == 0, "head_dim must be a multiple of 32");
  for (const at::Tensor* t : {&cos, &sin_signed}) {
    TORCH_CHECK(t->scalar_type() == at::kBFloat16 && t->is_contiguous() &&
                    t->numel() == tokens * dim && t->size(-1) == dim,
                "cos and sin must be contiguous bfloat16 [T, 1, D]");
  }
  at::Tensor out = at::empty({tokens, x.size(1), dim}, x.options());
  const semantic::RopeProblem p{static_cast<const bf16*>(x.data_ptr()),
                                x.stride(0),
                                static_cast<const bf16*>(cos.data_ptr()),
                                static_cast<const bf16*>(sin_signed.data_ptr()),
                                static_cast<bf16*>(out.data_ptr()),
                                tokens,
                                x.size(1),
                                dim};
  semantic::rope_bf16(p);
  return out;
}

at::Tensor swiglu(const at::Tensor& gate_up) {
  check_cpu(gate_up, "gate_up");
  TORCH_CHECK(gate_up.scalar_type() == at::kBFloat16 && gate_up.dim() == 2 &&
                  gate_up.is_contiguous() && gate_up.size(1) % 2 == 0,
              "gate_up must be a contiguous bfloat16 [T, 2·I]");
  const int64_t tokens = gate_up.size(0), inner = gate_up.size(1) / 2;
  at::Tensor out = at::empty({tokens, inner}, gate_up.options());
  semantic::swiglu_bf16(static_cast<const bf16*>(gate_up.data_ptr()),
                        static_cast<bf16*>(out.data_ptr()), tokens, inner);
  return out;
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, bool round_normed) {
  check_cpu(x, "x");
  check_cpu(weight, "weight");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "x must be [T, D] with contiguous rows");
  TORCH_CHECK(weight.dim() == 1 && weight.numel() == x.size(1) && weight.is_contiguous() &&
                  weight.scalar_type() == x.scalar_type(),
              "weight must be a contiguous [D] of x's dtype");
  at::Tensor y = at::empty(x.sizes(), x.options());
  const int64_t rows = x.size(0), d = x.size(1);
  if (x.scalar_type() == at::kBFloat16) {
    semantic::rms_norm_bf16(static_cast<const bf16*>(x.data_ptr()), x.stride(0),
                            static_cast<const bf16*>(weight.data_ptr()),
                            static_cast<bf16*>(y.data_ptr()), rows, d, static_cast<float>(eps),
                            round_normed);
  } else {
    TORCH_CHECK(x.scalar_type() == at::kFloat, "x must be bfloat16 or float32");
    semantic::rms_norm_f32(x.data_ptr<float>(), x.stride(0), weight.data_ptr<float>(),
                           y.data_ptr<float>(), rows, d, static_cast<float>(eps));
  }
  return y;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // Each call releases the GIL while it computes, as torch's own ops do: the engine thread
  // spends most of a step in these, and the event loop must serve HTTP meanwhile.
  using nogil = pybind11::call_guard<pybind11::gil_scoped_release>;
  m.def("paged_decode_attention", &paged_decode_attention, nogil(),
        "Decode attention over paged K/V blocks, read in place");
  m.def("paged_prefill_attention", &paged_prefill_attention, nogil(),
        "Causal prefill attention of a chunk over its paged K/V blocks, read in place");
  m.def("small_linear", &small_linear, nogil(), "x @ weight.T (+ bias) for a few bf16 rows");
  m.def("rms_norm", &rms_norm, nogil(), "RMSNorm in fp32, rounded, times the weight");
  m.def("unpack_weight", &unpack_weight, nogil(),
        "a packed weight back to plain rows, into out");
  m.def("small_linear_int8", &small_linear_int8, nogil(),
        "x @ (weight * scales).T (+ bias) for bf16 rows over an 8-bit weight, x quantized per 32");
  m.def("block_linear", &block_linear, nogil(),
        "x @ weight.T (+ bias) for bf16 rows over a weight in quantized groups (Q4_K's)");
  m.def("flat_linear", &flat_linear, nogil(),
        "x @ weight.T (+ bias) for bf16 rows over a weight in per-32 blocks (Q4_0 .. Q8_0)");
  m.def("write_kv_int8", &write_kv_int8, nogil(),
        "a step's K or V rows into an 8-bit pool, quantized per row on the way");
  m.def("rope", &rope, nogil(), "rotary embeddings of a step's heads, as models/rope.py rounds");
  m.def("swiglu", &swiglu, nogil(), "silu(gate) * up over a fused gate-up output");
  m.def("decode_supported", &semantic::decode_supported, pybind11::arg("head_dim"),
        pybind11::arg("heads"));
}
