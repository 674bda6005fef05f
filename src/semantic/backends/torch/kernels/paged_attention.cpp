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
// sum (online softmax). An 8-bit cache (int8 rows, a bf16 scale per row) is read the same way
// at half the bytes: each KV head's 16 key rows are widened to fp32 once for its G query heads
// (fp32 dot products with the query converted once), the key's scale multiplies its score, and
// in the values pass a value's scale multiplies its (fp32) weight. Measured: 8 sequences x 1,000 tokens, 30 layers, 2 cores: 8.9 ms with
// the next-item prefetch, 10.5 without, 11-12 one tile at a time (flash-decoding style), 12+
// with items per KV head (strided rows).
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

// An 8-bit cache's scores: for each KV head, its 16 key rows are widened to fp32 once (in L1)
// for all G query heads; q is fp32 [H][D]; each key's scale joins the softmax scale after the
// sums, so a score is (q · k_int) · k_scale · scale.
template <int D>
void span_scores_i8(const float* q, const Layout& l, RowWalk<int8_t> keys, const bf16* k_scales,
                    RowPrefetch<int8_t> values, int64_t n, float scale, float* s) {
  alignas(64) float k32[16 * D];
  alignas(64) float key_scale[16];
  for (int64_t t0 = 0; t0 < n; t0 += 16) {
    const int64_t count = std::min<int64_t>(16, n - t0);
    int64_t slots[16];
    for (int64_t i = 0; i < count; ++i) {
      slots[i] = keys.next_slot();
      values.next();
    }
    for (int64_t i = count; i < 16; ++i) slots[i] = slots[0];  // padding, never stored
    for (int64_t h = 0; h < l.kv_heads; ++h) {
      for (int i = 0; i < 16; ++i) {
        const int8_t* row = keys.base + slots[i] * l.row_stride + h * D;
        for (int c = 0; c < D / 16; ++c) _mm512_store_ps(k32 + i * D + 16 * c, load_i8x16(row + 16 * c));
        key_scale[i] = bf16_to_float(k_scales[slots[i] * l.kv_heads + h]) * scale;
      }
      const __m512 scale_v = _mm512_load_ps(key_scale);
      for (int64_t g = 0; g < l.group; ++g) {
        const int64_t head = h * l.group + g;
        __m512 partial[16];
        for (int i = 0; i < 16; ++i) partial[i] = dot<D>(q + head * D, k32 + i * D);
        _mm512_mask_storeu_ps(s + head * l.span_stride + t0, first_lanes(count),
                              _mm512_mul_ps(hsum16(partial), scale_v));
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

// acc[g][0..D) = sum over the span of p[g][t] * v[t] for `heads` (<= NG) query heads of one
// KV head, whose V rows `values` walks. fp32: one FMA per weight and value.
template <int D, int NG>
void span_values(int heads, int64_t stride, RowWalk<float> values, int64_t n, const float* p,
                 const bf16*, RowPrefetch<float>& ahead, float* acc) {
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
      if (g >= heads) break;
      const __m512 w = _mm512_set1_ps(p[g * stride + t]);
      for (int c = 0; c < C; ++c) o[g][c] = _mm512_fmadd_ps(w, v[c], o[g][c]);
    }
  }
  for (int g = 0; g < heads; ++g)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc + g * D + 16 * c, o[g][c]);
}

// int8 values (an 8-bit cache): each value row widened to fp32 once for the pass's heads, its
// scale folded into each head's weight; `scales` is the value scales of this KV head, a row's at
// slot · kv_heads.
template <int D, int NG>
void span_values_i8(int heads, int64_t stride, RowWalk<int8_t> values, const bf16* scales,
                    int64_t kv_heads, int64_t n, const float* p, RowPrefetch<int8_t>& ahead,
                    float* acc) {
  constexpr int C = D / 16;
  __m512 o[NG][C];
  for (int g = 0; g < NG; ++g)
    for (int c = 0; c < C; ++c) o[g][c] = _mm512_setzero_ps();
  for (int64_t t = 0; t < n; ++t) {
    const int64_t slot = values.next_slot();
    const int8_t* row = values.base + slot * values.row_stride;
    ahead.next();
    const float value_scale = bf16_to_float(scales[slot * kv_heads]);
    __m512 v[C];
    for (int c = 0; c < C; ++c) v[c] = load_i8x16(row + 16 * c);
    for (int g = 0; g < NG; ++g) {
      if (g >= heads) break;
      const __m512 w = _mm512_set1_ps(p[g * stride + t] * value_scale);
      for (int c = 0; c < C; ++c) o[g][c] = _mm512_fmadd_ps(w, v[c], o[g][c]);
    }
  }
  for (int g = 0; g < heads; ++g)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc + g * D + 16 * c, o[g][c]);
}

// bf16: two tokens at a time. Their V rows interleaved element by element (unpacklo/hi) are
// bf16 pairs that vdpbf16ps weighs with the pair of their two weights, so each instruction
// does 32 multiply-adds. The unpacks permute the output lanes within each 32 elements; the
// store puts them back in order.
template <int D, int NG>
void span_values(int heads, int64_t stride, RowWalk<bf16> values, int64_t n, const float*,
                 const bf16* pb, RowPrefetch<bf16>& ahead, float* acc) {
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
      if (g >= heads) break;
      uint32_t pair;
      __builtin_memcpy(&pair, pb + g * stride + t, 4);
      const __m512bh w = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
      for (int c = 0; c < C; ++c) {
        lo[g][c] = _mm512_dpbf16_ps(lo[g][c], w, (__m512bh)vlo[c]);
        hi[g][c] = _mm512_dpbf16_ps(hi[g][c], w, (__m512bh)vhi[c]);
      }
    }
  }
  // lo lane 4L + j holds element 8L + j of its chunk, hi lane 4L + j element 8L + 4 + j.
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second =
      _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int g = 0; g < heads; ++g) {
    for (int c = 0; c < C; ++c) {
      float* out = acc + g * D + 32 * c;
      _mm512_storeu_ps(out, _mm512_permutex2var_ps(lo[g][c], first, hi[g][c]));
      if (D % 32 == 0 || c < C - 1) {
        _mm512_storeu_ps(out + 16, _mm512_permutex2var_ps(lo[g][c], second, hi[g][c]));
      }
    }
  }
}

// One work item: every head of one sequence over one span; acc [H][D], ml [H][2]. Memory is
// kept busy throughout: the scores pass streams the span's K and prefetches its V into L2,
// the values pass (from L2) prefetches the K of the item this thread takes next. KV is the
// caches' type: T, or int8_t for an 8-bit cache (then q32 holds every query in fp32, [B][H][D]).
template <typename T, typename KV, int D>
void attend_span(const DecodeProblem& p, const Layout& l, const Span& span, const Span* next,
                 const float* q32, float* acc, float* ml) {
  constexpr int NG = heads_per_pass<D>();
  constexpr bool quantized = std::is_same_v<KV, int8_t>;
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
  if constexpr (quantized) {
    span_scores_i8<D>(q32 + span.seq * p.heads * D, l, walk(k, span), p.k_scales, values_ahead,
                      n, p.scale, s);
  } else {
    const T* q = static_cast<const T*>(p.q) + span.seq * p.q_stride_b;
    span_scores<T, D>(q, p.q_stride_h, l, walk(k, span), values_ahead, n, p.scale, s);
  }
  // int8 values are weighed in fp32, like fp32 ones.
  span_softmax<std::conditional_t<quantized, float, T>>(l.heads, l.span_stride, n, s, pb, ml);
  RowPrefetch<KV> ahead{walk(k, next != nullptr ? *next : span),
                        next != nullptr ? next->end - next->start : 0, l.row_stride};
  for (int64_t h = 0; h < l.kv_heads; ++h) {
    for (int64_t g0 = 0; g0 < l.group; g0 += NG) {
      const int64_t head = h * l.group + g0;
      const int heads = static_cast<int>(std::min<int64_t>(NG, l.group - g0));
      const int64_t offset = head * l.span_stride;
      if constexpr (quantized) {
        span_values_i8<D, NG>(heads, l.span_stride, walk(v + h * D, span), p.v_scales + h,
                              l.kv_heads, n, s + offset, ahead, acc + head * D);
      } else {
        span_values<D, NG>(heads, l.span_stride, walk(v + h * D, span), n, s + offset,
                           pb + offset, ahead, acc + head * D);
      }
    }
  }
}

// Every query in fp32, [B][H][D] contiguous: an 8-bit cache's dot products are fp32.
template <typename T, int D>
std::vector<float> queries_f32(const DecodeProblem& p) {
  std::vector<float> q32(p.batch * p.heads * D);
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.heads; ++h) {
      const T* src = static_cast<const T*>(p.q) + b * p.q_stride_b + h * p.q_stride_h;
      for (int c = 0; c < D / 16; ++c) {
        _mm512_storeu_ps(&q32[(b * p.heads + h) * D + 16 * c], load_x16(src + 16 * c));
      }
    }
  }
  return q32;
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
  const std::vector<float> q32 =
      std::is_same_v<KV, int8_t> ? queries_f32<T, D>(p) : std::vector<float>();
  std::atomic<int64_t> next{0};
  // One task per thread, each taking items off the counter until none are left.
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    for (int64_t i = next.fetch_add(1); i < items;) {
      const int64_t j = next.fetch_add(1);  // taken now, so its K streams in during item i
      const Span* following = j < items ? &spans[j] : nullptr;
      attend_span<T, KV, D>(p, l, spans[i], following, q32.data(), &acc[i * p.heads * D],
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
