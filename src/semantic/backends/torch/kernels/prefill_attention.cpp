// Paged prefill attention on AVX-512: a chunk's queries against its sequence's keys, read from
// the pool through the block table, causal from the chunk's position (flash-style).
//
// One KV head at a time, its K and V are first packed, on all cores, into tiles of 64 keys laid
// out for register-blocked matrix products (bf16: pairs along the reduction axis, for
// vdpbf16ps; fp32: FMAs). Then each work item, (16 query tokens, that KV head), takes all G
// query heads of the KV head as rows, so one load of each key serves G heads (GQA without
// repeating K/V), and walks the key tiles it can see: scores = Q·Kᵀ, an online-softmax update
// in fp32, out = out·α + P·V. Keys past the item's last visible one are never touched (the
// diagonal tile is cut to 16 keys); masking is per row. Items go to the cores from a shared
// counter, costliest (latest queries) first. Measured, 2 Zen 4 cores, 9 heads over 3 KV heads,
// head_dim 64, bf16: a 512-token chunk in 1.2 ms, 488 after 512 of context in 3.2 ms, ~260
// GFLOP/s of useful products (SDPA: 5 and 11 ms). Items of 24 or 96 rows instead of 48: same;
// without exp (an upper bound for a cheaper one): 12% faster. An 8-bit pool's int8 rows are
// dequantized (times their bf16 scale, rounded to q's type) as they are packed: the packed
// tiles, the only copy, are what the bf16 kernel reads, so nothing after the packing changes.
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels.h"

namespace semantic {
namespace {

constexpr int64_t kKeyTile = 64;  // keys per tile: 4 vectors of scores a row
constexpr int kScoreVecs = kKeyTile / 16;
constexpr int64_t kItemRows = 48;  // query rows (tokens x G heads) per item: ~8 row blocks

template <typename T>
const T* row_at(const PagedRows& r, int64_t token, int64_t head) {
  const T* base = static_cast<const T*>(r.base);
  const int64_t block = r.table != nullptr ? r.table[token / r.block_tokens] : 0;
  return base + block * r.block_stride + (token % r.block_tokens) * r.token_stride +
         head * r.head_stride;
}

// Rows of one register block: 24 accumulators, whatever the width.
template <int NV>
constexpr int block_rows() {
  return std::min(8, 24 / NV);
}

// c[r][0, 16·NV) = c[r] · scale[r] (0 without scale) + Σ_k a[r][k] · b[k][·] for RB rows.
// bf16 takes k in pairs: a's pair broadcast against b laid out [depth/2][ldb/2][2].
template <int NV, int RB>
inline void gemm_rows(const bf16* a, int64_t lda, const bf16* b, int64_t ldb, int64_t depth,
                      float* c, int64_t ldc, const float* scale) {
  __m512 acc[RB][NV];
  for (int r = 0; r < RB; ++r) {
    const __m512 s = scale != nullptr ? _mm512_set1_ps(scale[r]) : _mm512_setzero_ps();
    for (int v = 0; v < NV; ++v) {
      acc[r][v] = scale != nullptr ? _mm512_mul_ps(_mm512_loadu_ps(c + r * ldc + 16 * v), s) : s;
    }
  }
  for (int64_t k = 0; k < depth; k += 2) {
    __m512bh bv[NV];
    for (int v = 0; v < NV; ++v) {
      bv[v] = (__m512bh)_mm512_loadu_si512(b + k / 2 * ldb + 32 * v);
    }
    for (int r = 0; r < RB; ++r) {
      int32_t pair;
      std::memcpy(&pair, a + r * lda + k, 4);
      const __m512bh av = (__m512bh)_mm512_set1_epi32(pair);
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(c + r * ldc + 16 * v, acc[r][v]);
}

// fp32: b laid out [depth][ldb], one FMA per element pair.
template <int NV, int RB>
inline void gemm_rows(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t depth,
                      float* c, int64_t ldc, const float* scale) {
  __m512 acc[RB][NV];
  for (int r = 0; r < RB; ++r) {
    const __m512 s = scale != nullptr ? _mm512_set1_ps(scale[r]) : _mm512_setzero_ps();
    for (int v = 0; v < NV; ++v) {
      acc[r][v] = scale != nullptr ? _mm512_mul_ps(_mm512_loadu_ps(c + r * ldc + 16 * v), s) : s;
    }
  }
  for (int64_t k = 0; k < depth; ++k) {
    __m512 bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_loadu_ps(b + k * ldb + 16 * v);
    for (int r = 0; r < RB; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * lda + k]);
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(c + r * ldc + 16 * v, acc[r][v]);
}

template <typename T, int NV, int RB>
void gemm_tail(int64_t rows, const T* a, int64_t lda, const T* b, int64_t ldb, int64_t depth,
               float* c, int64_t ldc, const float* scale) {
  if constexpr (RB > 0) {
    if (rows == RB) return gemm_rows<NV, RB>(a, lda, b, ldb, depth, c, ldc, scale);
    gemm_tail<T, NV, RB - 1>(rows, a, lda, b, ldb, depth, c, ldc, scale);
  }
}

// The product over `rows` rows, in register blocks.
template <typename T, int NV>
void gemm(int64_t rows, const T* a, int64_t lda, const T* b, int64_t ldb, int64_t depth,
          float* c, int64_t ldc, const float* scale) {
  constexpr int RB = block_rows<NV>();
  int64_t r = 0;
  for (; r + RB <= rows; r += RB) {
    gemm_rows<NV, RB>(a + r * lda, lda, b, ldb, depth, c + r * ldc, ldc,
                      scale != nullptr ? scale + r : nullptr);
  }
  if (r < rows) {
    gemm_tail<T, NV, RB - 1>(rows - r, a + r * lda, lda, b, ldb, depth, c + r * ldc, ldc,
                             scale != nullptr ? scale + r : nullptr);
  }
}

// The lanes of a vector of 16 keys below `left`: all for 16 or more, none for 0 or fewer.
inline __mmask16 lanes_below(int64_t left) {
  return left >= 16  ? static_cast<__mmask16>(0xFFFF)
         : left <= 0 ? static_cast<__mmask16>(0)
                     : static_cast<__mmask16>((1u << left) - 1);
}

template <typename T>
constexpr int64_t kPairs = std::is_same_v<T, bf16> ? 2 : 1;  // elements per reduction step

// Scores s [rows][64] = Q·Kᵀ of the tile's first 16·vecs keys (the rest no row sees).
template <typename T>
void scores(int64_t rows, const T* q, const T* kp, int64_t dim, int64_t vecs, float* s) {
  const int64_t ldb = kKeyTile * kPairs<T>;
  switch (vecs) {
    case 1: return gemm<T, 1>(rows, q, dim, kp, ldb, dim, s, kKeyTile, nullptr);
    case 2: return gemm<T, 2>(rows, q, dim, kp, ldb, dim, s, kKeyTile, nullptr);
    case 3: return gemm<T, 3>(rows, q, dim, kp, ldb, dim, s, kKeyTile, nullptr);
    default: return gemm<T, 4>(rows, q, dim, kp, ldb, dim, s, kKeyTile, nullptr);
  }
}

// An 8-bit pool's row of `token` and `head`, dequantized into `out`: its int8 values times its
// scale, in fp32 and then rounded to T.
template <typename T, int D>
const T* dequantized_row(const PagedRows& r, int64_t token, int64_t head, T* out) {
  const int8_t* row = row_at<int8_t>(r, token, head);
  const int64_t block = r.table[token / r.block_tokens];
  const bf16 scale_bits = r.scales[block * r.scale_block_stride +
                                   (token % r.block_tokens) * r.scale_token_stride + head];
  const __m512 scale = _mm512_set1_ps(bf16_to_float(scale_bits));
  for (int c = 0; c < D / 16; ++c) {
    store_x16(out + 16 * c, _mm512_mul_ps(load_i8x16(row + 16 * c), scale));
  }
  return out;
}

// One KV head's tile of keys [k0, k0 + count), packed: K as the right side of Q·Kᵀ, V as the
// right side of P·V; zeros past `count`, so padded products are finite. KV is the pool's type:
// T, or int8_t for an 8-bit pool.
template <typename T, typename KV, int D>
void pack_tile(const PrefillProblem& p, int64_t head, int64_t k0, int64_t count, T* kp, T* vp) {
  std::fill(kp, kp + D * kKeyTile, T(0));
  std::fill(vp, vp + D * kKeyTile, T(0));
  alignas(64) T k_row[D], v_row[D];
  for (int64_t j = 0; j < count; ++j) {
    const T* k;
    const T* v;
    if constexpr (std::is_same_v<KV, int8_t>) {
      k = dequantized_row<T, D>(p.k, k0 + j, head, k_row);
      v = dequantized_row<T, D>(p.v, k0 + j, head, v_row);
    } else {
      k = row_at<T>(p.k, k0 + j, head);
      v = row_at<T>(p.v, k0 + j, head);
    }
    if constexpr (std::is_same_v<T, bf16>) {  // K [D/2][64][2], V [32][D][2]
      uint32_t pairs[D / 2];
      std::memcpy(pairs, k, sizeof(pairs));
      uint32_t* kw = reinterpret_cast<uint32_t*>(kp);
      for (int d = 0; d < D / 2; ++d) kw[d * kKeyTile + j] = pairs[d];
      bf16* vrow = vp + (j / 2) * 2 * D + (j % 2);
      for (int d = 0; d < D; ++d) vrow[2 * d] = v[d];
    } else {  // K [D][64], V [64][D]
      for (int d = 0; d < D; ++d) kp[d * kKeyTile + j] = k[d];
      std::memcpy(vp + j * D, v, D * sizeof(float));
    }
  }
}

// The first key the query at position `pos` sees: its window's first on a sliding layer.
inline int64_t first_key(const PrefillProblem& p, int64_t pos) {
  return p.window > 0 ? std::max<int64_t>(0, pos - p.window + 1) : 0;
}

// Scores s [rows][64] of one key tile → weights in p (T) and per-row α (the old sum's rescale);
// m, l: each row's running max and weight sum. Row r is token t0 + r / group, at position
// pos = context_len + t0 + r / group, which sees tile keys j with first_key(pos) <= k0 + j <= pos.
template <typename T>
void online_softmax(const PrefillProblem& p, int64_t rows, int64_t group, int64_t t0, int64_t k0,
                    int64_t count, float* s, T* pw, float* m, float* l, float* alpha) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512 scale = _mm512_set1_ps(p.scale);
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * kKeyTile;
    T* pr = pw + r * kKeyTile;
    const int64_t pos = p.context_len + t0 + r / group;
    const int64_t seen = std::clamp<int64_t>(pos - k0 + 1, 0, count);
    const int64_t skipped = std::clamp<int64_t>(first_key(p, pos) - k0, 0, kKeyTile);
    __m512 x[kScoreVecs];
    __m512 mv = neg_inf;
    for (int v = 0; v < kScoreVecs; ++v) {
      const __mmask16 lanes = lanes_below(seen - 16 * v) & ~lanes_below(skipped - 16 * v);
      x[v] = _mm512_mask_mul_ps(neg_inf, lanes, _mm512_loadu_ps(sr + 16 * v), scale);
      mv = _mm512_max_ps(mv, x[v]);
    }
    const float m_new = std::max(m[r], _mm512_reduce_max_ps(mv));
    if (m_new == -std::numeric_limits<float>::infinity()) {  // nothing seen yet: all weights 0
      alpha[r] = 1.0f;
      std::fill(pr, pr + kKeyTile, T(0));
      continue;
    }
    const __m512 m_v = _mm512_set1_ps(m_new);
    __m512 sum = _mm512_setzero_ps();
    for (int v = 0; v < kScoreVecs; ++v) {
      __m512 w = exp_nonpositive(_mm512_sub_ps(x[v], m_v));
      if constexpr (std::is_same_v<T, bf16>) {
        // P·V weighs with the rounded weights: their sum normalises.
        const __m256i rounded = (__m256i)_mm512_cvtneps_pbh(w);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(pr + 16 * v), rounded);
        w = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(rounded), 16));
      } else {
        _mm512_storeu_ps(pr + 16 * v, w);
      }
      sum = _mm512_add_ps(sum, w);
    }
    const float a = m[r] == -std::numeric_limits<float>::infinity()
                        ? 0.0f
                        : _mm512_cvtss_f32(exp_nonpositive(_mm512_set1_ps(m[r] - m_new)));
    alpha[r] = a;
    l[r] = l[r] * a + _mm512_reduce_add_ps(sum);
    m[r] = m_new;
  }
}

// 1 / the weight of a row's keys, l (at running max m); a head's sink logit, where there is
// one, is one more weight in the sum, with no value: the keys' weights rescaled to its max.
inline float normaliser(const PrefillProblem& p, int64_t q_head, float m, float l) {
  if (p.sinks == nullptr) return 1.0f / l;
  const float sink = p.sinks[q_head], m_all = std::max(m, sink);
  const float rescale = std::exp(m - m_all);
  return rescale / (l * rescale + std::exp(sink - m_all));
}

// Per-thread buffers of one item: Q rows, scores, weights, output sums, row statistics.
template <typename T, int D>
struct Scratch {
  std::vector<T> q, pw;
  std::vector<float> s, o, m, l, alpha;
  explicit Scratch(int64_t rows)
      : q(rows * D), pw(rows * kKeyTile), s(rows * kKeyTile), o(rows * D), m(rows), l(rows),
        alpha(rows) {}
};

// Query tokens [t0, t1) x the G query heads of KV head `head` over the packed tiles they see;
// `packed` starts at tile `first_tile`.
template <typename T, int D>
void attend_item(const PrefillProblem& p, const T* packed, int64_t first_tile, int64_t head,
                 int64_t t0, int64_t t1, Scratch<T, D>& w) {
  const int64_t group = p.heads / p.kv_heads;
  const int64_t rows = (t1 - t0) * group;
  const T* q = static_cast<const T*>(p.q);
  for (int64_t r = 0; r < rows; ++r) {  // row r: token t0 + r / G, query head head·G + r % G
    const T* src = q + (t0 + r / group) * p.q_stride_t + (head * group + r % group) * p.q_stride_h;
    std::memcpy(&w.q[r * D], src, D * sizeof(T));
  }
  std::fill(w.o.begin(), w.o.begin() + rows * D, 0.0f);
  std::fill(w.m.begin(), w.m.end(), -std::numeric_limits<float>::infinity());
  std::fill(w.l.begin(), w.l.end(), 0.0f);
  const int64_t total = p.context_len + p.n;
  const int64_t tiles = (p.context_len + t1 - 1) / kKeyTile + 1;  // the last token's keys
  // A sliding layer's first token sees none of the tiles before its window.
  for (int64_t i = first_key(p, p.context_len + t0) / kKeyTile; i < tiles; ++i) {
    const T* kp = packed + (i - first_tile) * 2 * D * kKeyTile;
    const int64_t k0 = i * kKeyTile, count = std::min(kKeyTile, total - k0);
    const int64_t seen = std::min(count, p.context_len + t1 - k0);  // by the item's last token
    scores<T>(rows, w.q.data(), kp, D, (seen + 15) / 16, w.s.data());
    online_softmax<T>(p, rows, group, t0, k0, count, w.s.data(), w.pw.data(), w.m.data(),
                      w.l.data(), w.alpha.data());
    const int64_t depth = std::is_same_v<T, bf16> ? (seen + 1) / 2 * 2 : seen;
    gemm<T, D / 16>(rows, w.pw.data(), kKeyTile, kp + D * kKeyTile, D * kPairs<T>, depth,
                    w.o.data(), D, w.alpha.data());
  }
  T* out = static_cast<T*>(p.out);
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 inv = _mm512_set1_ps(normaliser(p, head * group + r % group, w.m[r], w.l[r]));
    T* dst = out + ((t0 + r / group) * p.heads + head * group + r % group) * D;
    for (int c = 0; c < D / 16; ++c) {
      store_x16(dst + 16 * c, _mm512_mul_ps(_mm512_loadu_ps(&w.o[r * D + 16 * c]), inv));
    }
  }
}

// One KV head at a time: its packed K/V (256 KiB for 1,000 bf16 keys of head_dim 64) stay in
// each core's L2 while every item of that head reads them, and the buffer is 1/KVH the size.
template <typename T, typename KV, int D>
void paged_prefill(const PrefillProblem& p) {
  const int64_t group = p.heads / p.kv_heads;
  const int64_t total = p.context_len + p.n;
  const int64_t key_tiles = (total + kKeyTile - 1) / kKeyTile;
  // On a sliding layer, tiles before the chunk's first window are never read: not packed.
  const int64_t first_tile = first_key(p, p.context_len) / kKeyTile;
  const int64_t tokens = std::max<int64_t>(1, kItemRows / group);
  const int64_t query_tiles = (p.n + tokens - 1) / tokens;
  std::vector<T> packed((key_tiles - first_tile) * 2 * D * kKeyTile);
  for (int64_t head = 0; head < p.kv_heads; ++head) {
    at::parallel_for(first_tile, key_tiles, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        T* kp = packed.data() + (i - first_tile) * 2 * D * kKeyTile;
        const int64_t k0 = i * kKeyTile;
        pack_tile<T, KV, D>(p, head, k0, std::min(kKeyTile, total - k0), kp, kp + D * kKeyTile);
      }
    });
    std::atomic<int64_t> next{0};
    at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
      Scratch<T, D> scratch(tokens * group);
      for (int64_t i = next.fetch_add(1); i < query_tiles; i = next.fetch_add(1)) {
        const int64_t t0 = (query_tiles - 1 - i) * tokens;  // latest (costliest) first
        attend_item<T, D>(p, packed.data(), first_tile, head, t0, std::min(p.n, t0 + tokens),
                          scratch);
      }
    });
  }
}

template <typename T, typename KV>
void dispatch(const PrefillProblem& p) {
  switch (p.head_dim) {
    case 16: return paged_prefill<T, KV, 16>(p);
    case 32: return paged_prefill<T, KV, 32>(p);
    case 64: return paged_prefill<T, KV, 64>(p);
    case 128: return paged_prefill<T, KV, 128>(p);
    case 256: return paged_prefill<T, KV, 256>(p);
    default: return;  // prefill_supported() said no; the caller checked
  }
}

}  // namespace

bool prefill_supported(int64_t head_dim) {
  return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128 ||
         head_dim == 256;
}

void paged_prefill_f32(const PrefillProblem& p) {
  return p.k.scales != nullptr ? dispatch<float, int8_t>(p) : dispatch<float, float>(p);
}
void paged_prefill_bf16(const PrefillProblem& p) {
  return p.k.scales != nullptr ? dispatch<bf16, int8_t>(p) : dispatch<bf16, bf16>(p);
}

}  // namespace semantic
