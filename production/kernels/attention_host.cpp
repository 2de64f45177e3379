// Host twin of the document-masked causal attention (attention.hpp). Per sample, per query head,
// per row t: scores over the span, softmax, context; the backward recomputes the probabilities
// from the saved log-sum-exp. Gradients accumulate in fp32 scratch (heads, then t, then s, each
// increasing) and are rounded once when stored. In bf16 the probabilities and score gradients are
// rounded where the tensor-core twin rounds them (attention.hpp), with its key tiles.
//
// The *_ordered functions state that arithmetic one value at a time. The shipped ones compute
// the same operations in the same order for every value, faster: the operands widened to fp32
// once per call, the keys and values of a sample's group also transposed so that 8 scores (dot
// products over hd, each in its own vector lane, i increasing) are formed at once, and each
// exp(z - max) computed once and reused. The two give the same bits (tests/production_ops_test.cpp).
#include "production/kernels/attention.hpp"

#include "production/kernels/host_workers.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {
namespace {

// Element offsets of one sample's row t of a [samples*seq, heads*hd] activation, head `head`.
struct RowIndex {
  std::int64_t seq = 0;
  std::int64_t width = 0;     // heads * hd of the activation
  std::int64_t head_dim = 0;
  std::int64_t operator()(std::int64_t sample, std::int64_t t, std::int64_t head) const {
    return (sample * seq + t) * width + head * head_dim;
  }
};

Real dot(const void* a, std::int64_t a_offset, const void* b, std::int64_t b_offset,
          std::int64_t length, DType dtype) {
  Real sum = 0.0f;
  for (std::int64_t i = 0; i < length; ++i) {
    sum += load_as_f32(a, dtype, a_offset + i) * load_as_f32(b, dtype, b_offset + i);
  }
  return sum;
}

}  // namespace

void attention_forward_host_ordered(const AttentionForwardParams& p) {
  const AttentionShape& shape = p.shape;
  const std::int64_t hd = shape.head_dim;
  const std::int64_t heads_per_group = shape.heads / shape.groups;
  const RowIndex query_at{shape.seq, shape.heads * hd, hd};
  const RowIndex kv_at{shape.seq, shape.groups * hd, hd};
  std::vector<Real> scores(static_cast<std::size_t>(shape.seq));  // [seq] one row's span
  std::vector<Real> output(static_cast<std::size_t>(hd));         // [hd]
  for (std::int64_t sample = 0; sample < shape.samples; ++sample) {
    for (std::int64_t head = 0; head < shape.heads; ++head) {
      const std::int64_t group = head / heads_per_group;  // SPEC 4: repeat_kv
      for (std::int64_t t = 0; t < shape.seq; ++t) {
        const std::int64_t first = p.attention_start[sample * shape.seq + t];
        Real max_score = 0.0f;
        for (std::int64_t s = first; s <= t; ++s) {
          const Real z = dot(p.query, query_at(sample, t, head), p.key, kv_at(sample, s, group), hd,
                              p.dtype) * p.scale;
          scores[static_cast<std::size_t>(s)] = z;
          if (s == first || z > max_score) max_score = z;
        }
        Real normalizer = 0.0f;
        for (std::int64_t s = first; s <= t; ++s) {
          normalizer += std::exp(scores[static_cast<std::size_t>(s)] - max_score);
        }
        p.logsumexp[(sample * shape.seq + t) * shape.heads + head] = max_score + std::log(normalizer);
        std::fill(output.begin(), output.end(), 0.0f);
        if (p.dtype == DType::f32) {
          for (std::int64_t s = first; s <= t; ++s) {
            const Real probability = std::exp(scores[static_cast<std::size_t>(s)] - max_score) / normalizer;
            const std::int64_t v = kv_at(sample, s, group);
            for (std::int64_t i = 0; i < hd; ++i) {
              output[static_cast<std::size_t>(i)] += probability * load_as_f32(p.value, p.dtype, v + i);
            }
          }
        } else {
          // bf16: p~ = exp(z - m) rounded, m the running max over the key tiles so far
          // (attention.hpp), then rescaled to the final max and normalized.
          Real running_max = -INFINITY;
          for (std::int64_t tile = first / kAttentionKeyTile * kAttentionKeyTile; tile <= t; tile += kAttentionKeyTile) {
            const std::int64_t begin = std::max(tile, first);
            const std::int64_t end = std::min(tile + kAttentionKeyTile - 1, t);
            for (std::int64_t s = begin; s <= end; ++s) {
              running_max = std::max(running_max, scores[static_cast<std::size_t>(s)]);
            }
            const Real rescale = std::exp(running_max - max_score) / normalizer;
            for (std::int64_t s = begin; s <= end; ++s) {
              const Real rounded = round_to(DType::bf16, std::exp(scores[static_cast<std::size_t>(s)] - running_max));
              const Real weight = rounded * rescale;
              const std::int64_t v = kv_at(sample, s, group);
              for (std::int64_t i = 0; i < hd; ++i) {
                output[static_cast<std::size_t>(i)] += weight * load_as_f32(p.value, p.dtype, v + i);
              }
            }
          }
        }
        const std::int64_t out = query_at(sample, t, head);
        for (std::int64_t i = 0; i < hd; ++i) {
          store_from_f32(p.context, p.dtype, out + i, output[static_cast<std::size_t>(i)]);
        }
      }
    }
  }
}

void attention_backward_host_ordered(const AttentionBackwardParams& p) {
  const AttentionShape& shape = p.shape;
  const std::int64_t hd = shape.head_dim;
  const std::int64_t heads_per_group = shape.heads / shape.groups;
  const RowIndex query_at{shape.seq, shape.heads * hd, hd};
  const RowIndex kv_at{shape.seq, shape.groups * hd, hd};
  const std::int64_t rows = shape.samples * shape.seq;
  std::vector<Real> query_grad(static_cast<std::size_t>(rows * shape.heads * hd), 0.0f);  // [rows, H*hd]
  std::vector<Real> key_grad(static_cast<std::size_t>(rows * shape.groups * hd), 0.0f);    // [rows, G*hd]
  std::vector<Real> value_grad(static_cast<std::size_t>(rows * shape.groups * hd), 0.0f);  // [rows, G*hd]
  const bool rounded = p.dtype == DType::bf16;
  for (std::int64_t sample = 0; sample < shape.samples; ++sample) {
    for (std::int64_t head = 0; head < shape.heads; ++head) {
      const std::int64_t group = head / heads_per_group;
      for (std::int64_t t = 0; t < shape.seq; ++t) {
        const std::int64_t first = p.attention_start[sample * shape.seq + t];
        const std::int64_t q = query_at(sample, t, head);
        const Real lse = p.logsumexp[(sample * shape.seq + t) * shape.heads + head];
        const Real expected_grad = dot(p.context_grad, q, p.context, q, hd, p.dtype);  // D_t
        for (std::int64_t s = first; s <= t; ++s) {
          const std::int64_t kv = kv_at(sample, s, group);
          const Real z = dot(p.query, q, p.key, kv, hd, p.dtype) * p.scale;
          const Real probability = std::exp(z - lse);
          const Real probability_grad = dot(p.context_grad, q, p.value, kv, hd, p.dtype);
          // fp32: dz scaled per term. bf16: p and dz rounded as the tensor cores take them, scale
          // applied to the finished sums below (attention.hpp).
          const Real score_grad = rounded ? round_to(DType::bf16, probability * (probability_grad - expected_grad))
                                           : probability * (probability_grad - expected_grad) * p.scale;
          const Real value_weight = rounded ? round_to(DType::bf16, probability) : probability;
          for (std::int64_t i = 0; i < hd; ++i) {
            const Real dctx = load_as_f32(p.context_grad, p.dtype, q + i);
            query_grad[static_cast<std::size_t>(q + i)] += score_grad * load_as_f32(p.key, p.dtype, kv + i);
            key_grad[static_cast<std::size_t>(kv + i)] += score_grad * load_as_f32(p.query, p.dtype, q + i);
            value_grad[static_cast<std::size_t>(kv + i)] += value_weight * dctx;
          }
        }
      }
    }
  }
  if (rounded) {  // bf16: scale once, after the sums
    for (Real& sum : query_grad) sum *= p.scale;
    for (Real& sum : key_grad) sum *= p.scale;
  }
  for (std::size_t i = 0; i < query_grad.size(); ++i) {
    store_from_f32(p.query_grad, p.dtype, static_cast<std::int64_t>(i), query_grad[i]);
  }
  for (std::size_t i = 0; i < key_grad.size(); ++i) {
    store_from_f32(p.key_grad, p.dtype, static_cast<std::int64_t>(i), key_grad[i]);
    store_from_f32(p.value_grad, p.dtype, static_cast<std::int64_t>(i), value_grad[i]);
  }
}

namespace {

using Lanes = Real __attribute__((vector_size(16)));  // 4 fp32 lanes (2 in the semantic build)
constexpr std::int64_t kLanes = sizeof(Lanes) / sizeof(Real);  // IEEE + and * per lane
constexpr std::int64_t kScoreBlock = 2 * kLanes;  // scores formed at once

Lanes load_lanes(const Real* values) {
  Lanes lanes;
  std::memcpy(&lanes, values, sizeof(Lanes));
  return lanes;
}
void store_lanes(Real* values, Lanes lanes) { std::memcpy(values, &lanes, sizeof(Lanes)); }
Lanes splat(Real value) { return value - Lanes{}; }  // value in every lane (-0 stays -0)

// The whole [rows, width] tensor as fp32 (exact for bf16), into `out` (its storage reused).
const std::vector<Real>& widen_into(std::vector<Real>& out, const void* data, DType dtype, std::int64_t count) {
  out.resize(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) out[static_cast<std::size_t>(i)] = load_as_f32(data, dtype, i);
  return out;
}

// One sample's group of a [samples*seq, G*hd] fp32 tensor transposed to [hd, seq + padding]
// (positions contiguous), so that consecutive positions' elements i sit side by side. A block of
// dots may start at any position up to seq - 1: the padding (zeros, never used) covers its end.
struct Transposed {
  std::int64_t stride = 0;    // seq + kScoreBlock
  std::vector<Real> values;  // [hd, stride]
  void fill(const std::vector<Real>& source, const AttentionShape& shape, std::int64_t sample, std::int64_t group) {
    const std::int64_t hd = shape.head_dim;
    stride = shape.seq + kScoreBlock;
    values.assign(static_cast<std::size_t>(hd * stride), 0.0f);
    for (std::int64_t s = 0; s < shape.seq; ++s) {
      const Real* row = source.data() + ((sample * shape.seq + s) * shape.groups + group) * hd;
      for (std::int64_t i = 0; i < hd; ++i) values[static_cast<std::size_t>(i * stride + s)] = row[i];
    }
  }
};

// dots[s - begin] = sum_i (row[i] * columns[i][s]) with i increasing, for the kScoreBlock
// positions from `begin`: each lane is one dot product, summed in the order dot() sums it.
void block_of_dots(const Real* row, const Transposed& columns, std::int64_t hd, std::int64_t begin, Real* dots) {
  Lanes low = splat(0.0f);
  Lanes high = splat(0.0f);
  for (std::int64_t i = 0; i < hd; ++i) {
    const Real* column = columns.values.data() + i * columns.stride + begin;
    const Lanes weight = splat(row[i]);
    low += weight * load_lanes(column);
    high += weight * load_lanes(column + kLanes);
  }
  store_lanes(dots, low);
  store_lanes(dots + kLanes, high);
}

// target[0, hd) += weight * source[0, hd), element by element (hd lanes at a time).
void add_scaled(Real* target, Real weight, const Real* source, std::int64_t hd) {
  std::int64_t i = 0;
  const Lanes weights = splat(weight);
  for (; i + kLanes <= hd; i += kLanes) store_lanes(target + i, load_lanes(target + i) + weights * load_lanes(source + i));
  for (; i < hd; ++i) target[i] += weight * source[i];
}

Real row_dot(const Real* a, const Real* b, std::int64_t hd) {
  Real sum = 0.0f;
  for (std::int64_t i = 0; i < hd; ++i) sum += a[i] * b[i];
  return sum;
}

// Every buffer of the fast kernels, kept per thread across calls: no allocation once they are
// large enough.
struct Scratch {
  std::vector<Real> query, key, value, context, context_grad;  // widened operands
  std::vector<Real> query_grad, key_grad, value_grad;          // fp32 sums
  std::vector<Real> dots, probability_dots, exps, output;
  Transposed keys, values;
};
Scratch& thread_scratch() {
  thread_local Scratch scratch;
  return scratch;
}

// Runs `pairs` over every (sample, group) pair of `shape`: split among the workers when the work
// is large enough to pay for waking them (a few hundred thousand multiply-adds per call), else on
// the calling thread.
template <class Pairs>
void run_pairs(HostWorkers* workers, const AttentionShape& shape, const Pairs& pairs) {
  const std::int64_t count = shape.samples * shape.groups;
  const std::int64_t work = shape.samples * shape.heads * shape.seq * shape.seq * shape.head_dim;
  if (workers == nullptr || workers->threads() == 1 || work < (std::int64_t{1} << 19)) {
    pairs(0, count);
  } else {
    workers->for_each(count, pairs);
  }
}

}  // namespace

void attention_forward_host(const AttentionForwardParams& p, HostWorkers* workers) {
  const AttentionShape& shape = p.shape;
  const std::int64_t hd = shape.head_dim;
  const std::int64_t heads_per_group = shape.heads / shape.groups;
  const std::int64_t rows = shape.samples * shape.seq;
  Scratch& caller = thread_scratch();
  const std::vector<Real>& query = widen_into(caller.query, p.query, p.dtype, rows * shape.heads * hd);   // [rows, H*hd]
  const std::vector<Real>& key = widen_into(caller.key, p.key, p.dtype, rows * shape.groups * hd);        // [rows, G*hd]
  const std::vector<Real>& value = widen_into(caller.value, p.value, p.dtype, rows * shape.groups * hd);  // [rows, G*hd]
  // The (sample, group) pairs [begin, end): each writes its own heads' rows of the context and
  // logsumexp, so the pairs may run on different threads (with each thread's own scratch).
  const auto pairs = [&](std::int64_t begin, std::int64_t end) {
    Scratch& scratch = thread_scratch();
    std::vector<Real>& dots = scratch.dots;  // q . k of one row's span
    dots.resize(static_cast<std::size_t>(shape.seq + kScoreBlock));
    std::vector<Real>& exps = scratch.exps;  // exp(z - max)
    exps.resize(static_cast<std::size_t>(shape.seq));
    std::vector<Real>& output = scratch.output;  // [hd]
    output.resize(static_cast<std::size_t>(hd));
    Transposed& keys = scratch.keys;
    for (std::int64_t pair = begin; pair < end; ++pair) {
      const std::int64_t sample = pair / shape.groups;
      const std::int64_t group = pair % shape.groups;
      keys.fill(key, shape, sample, group);
      for (std::int64_t head = group * heads_per_group; head < (group + 1) * heads_per_group; ++head) {
        for (std::int64_t t = 0; t < shape.seq; ++t) {
          const std::int64_t first = p.attention_start[sample * shape.seq + t];
          const Real* q = query.data() + ((sample * shape.seq + t) * shape.heads + head) * hd;
          for (std::int64_t s = first; s <= t; s += kScoreBlock) block_of_dots(q, keys, hd, s, dots.data() + s);
          Real max_score = 0.0f;
          for (std::int64_t s = first; s <= t; ++s) {
            const Real z = dots[static_cast<std::size_t>(s)] * p.scale;
            dots[static_cast<std::size_t>(s)] = z;
            if (s == first || z > max_score) max_score = z;
          }
          Real normalizer = 0.0f;
          for (std::int64_t s = first; s <= t; ++s) {
            exps[static_cast<std::size_t>(s)] = std::exp(dots[static_cast<std::size_t>(s)] - max_score);
            normalizer += exps[static_cast<std::size_t>(s)];
          }
          p.logsumexp[(sample * shape.seq + t) * shape.heads + head] = max_score + std::log(normalizer);
          std::fill(output.begin(), output.end(), 0.0f);
          const auto value_row = [&](std::int64_t s) { return value.data() + ((sample * shape.seq + s) * shape.groups + group) * hd; };
          if (p.dtype == DType::f32) {
            for (std::int64_t s = first; s <= t; ++s) {
              add_scaled(output.data(), exps[static_cast<std::size_t>(s)] / normalizer, value_row(s), hd);
            }
          } else {
            // bf16: p~ = exp(z - m) rounded, m the running max over the key tiles so far
            // (attention.hpp), then rescaled to the final max and normalized.
            Real running_max = -INFINITY;
            for (std::int64_t tile = first / kAttentionKeyTile * kAttentionKeyTile; tile <= t; tile += kAttentionKeyTile) {
              const std::int64_t begin = std::max(tile, first);
              const std::int64_t end = std::min(tile + kAttentionKeyTile - 1, t);
              for (std::int64_t s = begin; s <= end; ++s) running_max = std::max(running_max, dots[static_cast<std::size_t>(s)]);
              const Real rescale = std::exp(running_max - max_score) / normalizer;
              for (std::int64_t s = begin; s <= end; ++s) {
                const Real rounded = round_to(DType::bf16, std::exp(dots[static_cast<std::size_t>(s)] - running_max));
                add_scaled(output.data(), rounded * rescale, value_row(s), hd);
              }
            }
          }
          const std::int64_t out = ((sample * shape.seq + t) * shape.heads + head) * hd;
          for (std::int64_t i = 0; i < hd; ++i) store_from_f32(p.context, p.dtype, out + i, output[static_cast<std::size_t>(i)]);
        }
      }
    }
  };
  run_pairs(workers, shape, pairs);
}

void attention_backward_host(const AttentionBackwardParams& p, HostWorkers* workers) {
  const AttentionShape& shape = p.shape;
  const std::int64_t hd = shape.head_dim;
  const std::int64_t heads_per_group = shape.heads / shape.groups;
  const std::int64_t rows = shape.samples * shape.seq;
  Scratch& scratch = thread_scratch();
  const std::vector<Real>& query = widen_into(scratch.query, p.query, p.dtype, rows * shape.heads * hd);
  const std::vector<Real>& key = widen_into(scratch.key, p.key, p.dtype, rows * shape.groups * hd);
  const std::vector<Real>& value = widen_into(scratch.value, p.value, p.dtype, rows * shape.groups * hd);
  const std::vector<Real>& context = widen_into(scratch.context, p.context, p.dtype, rows * shape.heads * hd);
  const std::vector<Real>& context_grad =
      widen_into(scratch.context_grad, p.context_grad, p.dtype, rows * shape.heads * hd);
  std::vector<Real>& query_grad = scratch.query_grad;  // [rows, H*hd]
  query_grad.assign(static_cast<std::size_t>(rows * shape.heads * hd), 0.0f);
  std::vector<Real>& key_grad = scratch.key_grad;  // [rows, G*hd]
  key_grad.assign(static_cast<std::size_t>(rows * shape.groups * hd), 0.0f);
  std::vector<Real>& value_grad = scratch.value_grad;  // [rows, G*hd]
  value_grad.assign(static_cast<std::size_t>(rows * shape.groups * hd), 0.0f);
  const bool rounded = p.dtype == DType::bf16;
  // The ordered twin walks (sample, head, t, s): heads in order, so a group's heads are
  // consecutive and the group's transposes serve them all. A (sample, group) pair's sums touch
  // only its own rows of the three gradients (its heads' query rows, its group's key and value
  // rows), each in that order: the pairs may run on different threads.
  const auto pairs = [&](std::int64_t begin, std::int64_t end) {
    Scratch& mine = thread_scratch();
    std::vector<Real>& score_dots = mine.dots;  // q . k
    score_dots.resize(static_cast<std::size_t>(shape.seq + kScoreBlock));
    std::vector<Real>& probability_dots = mine.probability_dots;  // dctx . v
    probability_dots.resize(static_cast<std::size_t>(shape.seq + kScoreBlock));
    Transposed& keys = mine.keys;
    Transposed& values = mine.values;
    for (std::int64_t pair = begin; pair < end; ++pair) {
      const std::int64_t sample = pair / shape.groups;
      const std::int64_t group = pair % shape.groups;
      keys.fill(key, shape, sample, group);
      values.fill(value, shape, sample, group);
      for (std::int64_t head = group * heads_per_group; head < (group + 1) * heads_per_group; ++head) {
        for (std::int64_t t = 0; t < shape.seq; ++t) {
          const std::int64_t first = p.attention_start[sample * shape.seq + t];
          const std::int64_t q = ((sample * shape.seq + t) * shape.heads + head) * hd;
          const Real lse = p.logsumexp[(sample * shape.seq + t) * shape.heads + head];
          const Real expected_grad = row_dot(context_grad.data() + q, context.data() + q, hd);  // D_t
          for (std::int64_t s = first; s <= t; s += kScoreBlock) {
            block_of_dots(query.data() + q, keys, hd, s, score_dots.data() + s);
            block_of_dots(context_grad.data() + q, values, hd, s, probability_dots.data() + s);
          }
          for (std::int64_t s = first; s <= t; ++s) {
            const std::int64_t kv = ((sample * shape.seq + s) * shape.groups + group) * hd;
            const Real z = score_dots[static_cast<std::size_t>(s)] * p.scale;
            const Real probability = std::exp(z - lse);
            const Real probability_grad = probability_dots[static_cast<std::size_t>(s)];
            // fp32: dz scaled per term. bf16: p and dz rounded as the tensor cores take them, scale
            // applied to the finished sums below (attention.hpp).
            const Real score_grad = rounded ? round_to(DType::bf16, probability * (probability_grad - expected_grad))
                                             : probability * (probability_grad - expected_grad) * p.scale;
            const Real value_weight = rounded ? round_to(DType::bf16, probability) : probability;
            add_scaled(query_grad.data() + q, score_grad, key.data() + kv, hd);
            add_scaled(key_grad.data() + kv, score_grad, query.data() + q, hd);
            add_scaled(value_grad.data() + kv, value_weight, context_grad.data() + q, hd);
          }
        }
      }
    }
  };
  run_pairs(workers, shape, pairs);
  if (rounded) {  // bf16: scale once, after the sums
    for (Real& sum : query_grad) sum *= p.scale;
    for (Real& sum : key_grad) sum *= p.scale;
  }
  for (std::size_t i = 0; i < query_grad.size(); ++i) {
    store_from_f32(p.query_grad, p.dtype, static_cast<std::int64_t>(i), query_grad[i]);
  }
  for (std::size_t i = 0; i < key_grad.size(); ++i) {
    store_from_f32(p.key_grad, p.dtype, static_cast<std::int64_t>(i), key_grad[i]);
    store_from_f32(p.value_grad, p.dtype, static_cast<std::int64_t>(i), value_grad[i]);
  }
}

}  // namespace tandem::production
