// The attention core of a training step on XLA:CPU, float32: the forward pass with its
// log-sum-exp, and the backward pass that recomputes the probabilities from it.
//
// q [..., T, K], k and v [..., S, K] (the leading axes flattened into slices, one per batch row
// and head): o = softmax(q k^T) v over the S keys, lse = the log-sum-exp of each row of q k^T;
// given the output's cotangent g, dq, dk and dv. The caller scales q. Each slice is computed
// whole by one thread, and its sums run in a fixed order, so results do not depend on the
// thread count. Built for the machine that runs it (`hydra_jax/native/__init__.py`).
//
// Every inner loop runs along the queries' axis, padded with zeros to a multiple of 16, so the
// compiler vectorises it whole: the probabilities are held transposed ([S, T]), which makes the
// softmax's reductions over keys element-wise across rows, and only the key and value
// gradients reduce across vector lanes. Head widths up to 8 are each compiled as a constant, so
// the sums over them unroll into registers (`attention.py` calls the kernels for those alone:
// XLA's own products are faster for wider heads, which `python -m bench.native` times here).

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// exp(x) within 1 ulp for x in [-87.3, 88] (0.93 at worst over every 7th float32 there):
// x = n ln2 + r with |r| <= ln2 / 2, exp(r) by its Taylor polynomial of degree 7, 2^n from the
// exponent bits. Vectorises (std::exp does not).
inline float exp_approx(float x) {
  x = std::min(std::max(x, -87.3f), 88.0f);
  const float n = std::nearbyint(x * 1.44269504088896341f);
  float r = x - n * 0.693145751953125f;  // ln2 in two parts: the first exact times any n
  r = r - n * 1.428606765330187e-06f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// Runs body(i, scratch) for i in [0, count) on the calling thread and XLA's intra-op pool, each
// thread with its own `floats` of scratch. The caller takes indices too and waits only for those
// taken, so it never waits on a task the pool has not started; a helper that cannot allocate
// its scratch takes none. Throws std::bad_alloc only before any work starts.
template <typename F>
void parallel_for(ffi::ThreadPool& pool, int64_t count, int64_t floats, const F& body) {
  struct State {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
  };
  auto state = std::make_shared<State>();
  auto run = [state, count, body](float* scratch) {
    for (int64_t i; (i = state->next.fetch_add(1)) < count;) {
      body(i, scratch);
      state->done.fetch_add(1);
    }
  };
  std::vector<float> own(floats);
  auto helper = [run, floats]() {
    std::vector<float> scratch;
    try {
      scratch.resize(floats);
    } catch (const std::bad_alloc&) {
      return;
    }
    run(scratch.data());
  };
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), count) - 1;
  for (int64_t h = 0; h < helpers; ++h) pool.Schedule(decltype(helper)(helper));
  run(own.data());
  while (state->done.load() < count) std::this_thread::yield();
}

constexpr int kMaxWidth = 256;  // wider heads are refused

inline int64_t padded(int64_t T) { return (T + 15) / 16 * 16; }

// The floats of scratch one slice's pass uses.
inline int64_t forward_scratch(int64_t T, int64_t S, int64_t K) {
  return (2 * K + S + 2) * padded(T);
}

// One slice: q [T, K], k and v [S, K] -> o [T, K], lse [T].
template <int N>
void forward_slice(const float* __restrict q, const float* __restrict k,
                   const float* __restrict v, float* __restrict o, float* __restrict lse,
                   int64_t T, int64_t S, int64_t width, float* __restrict scratch) {
  const int64_t K = N ? N : width, P = padded(T);
  std::fill(scratch, scratch + forward_scratch(T, S, K), 0.0f);
  float* __restrict qt = scratch;        // [K, P]: q transposed
  float* __restrict pt = qt + K * P;     // [S, P]: logits, then unnormalised probabilities
  float* __restrict m = pt + S * P;      // [P]: each query's largest logit
  float* __restrict l = m + P;           // [P]: each query's sum of probabilities
  float* __restrict ot = l + P;          // [K, P]: unnormalised output, transposed
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < K; ++d) qt[d * P + t] = q[t * K + d];
  std::fill(m, m + P, -INFINITY);
  for (int64_t s = 0; s < S; ++s) {
    float c[N ? N : kMaxWidth];
    for (int64_t d = 0; d < K; ++d) c[d] = k[s * K + d];
    float* __restrict row = pt + s * P;
#pragma omp simd
    for (int64_t t = 0; t < P; ++t) {
      float a = 0.0f;
      for (int64_t d = 0; d < K; ++d) a += c[d] * qt[d * P + t];
      row[t] = a;
      m[t] = a > m[t] ? a : m[t];
    }
  }
  for (int64_t s = 0; s < S; ++s) {
    float c[N ? N : kMaxWidth];
    for (int64_t d = 0; d < K; ++d) c[d] = v[s * K + d];
    float* __restrict row = pt + s * P;
#pragma omp simd
    for (int64_t t = 0; t < P; ++t) {
      const float e = exp_approx(row[t] - m[t]);
      l[t] += e;
      for (int64_t d = 0; d < K; ++d) ot[d * P + t] += c[d] * e;
    }
  }
  for (int64_t t = 0; t < T; ++t) {
    const float inverse = 1.0f / l[t];
    for (int64_t d = 0; d < K; ++d) o[t * K + d] = ot[d * P + t] * inverse;
    lse[t] = m[t] + std::log(l[t]);
  }
}

inline int64_t backward_scratch(int64_t T, int64_t K) { return (3 * K + 5) * padded(T); }

// One slice's gradients: with p = exp(q k^T - lse) and D = rowsum(g * o),
// ds = p * (g v^T - D), dq = ds k, dk = ds^T q, dv = p^T g; one key (row of p^T) at a time.
template <int N>
void backward_slice(const float* __restrict q, const float* __restrict k,
                    const float* __restrict v, const float* __restrict o,
                    const float* __restrict lse, const float* __restrict g,
                    float* __restrict dq, float* __restrict dk, float* __restrict dv,
                    int64_t T, int64_t S, int64_t width, float* __restrict scratch) {
  const int64_t K = N ? N : width, P = padded(T);
  std::fill(scratch, scratch + backward_scratch(T, K), 0.0f);
  float* __restrict qt = scratch;        // [K, P]: q transposed
  float* __restrict gt = qt + K * P;     // [K, P]: g transposed
  float* __restrict dqt = gt + K * P;    // [K, P]: dq transposed
  float* __restrict L = dqt + K * P;     // [P]: lse
  float* __restrict D = L + P;           // [P]: rowsum(g * o)
  float* __restrict p = D + P;           // [P]: one key's probabilities
  float* __restrict ds = p + P;          // [P]: the logits' cotangents
  for (int64_t t = 0; t < T; ++t) {
    float sum = 0.0f;
    for (int64_t d = 0; d < K; ++d) {
      qt[d * P + t] = q[t * K + d];
      gt[d * P + t] = g[t * K + d];
      sum += g[t * K + d] * o[t * K + d];
    }
    D[t] = sum;
    L[t] = lse[t];
  }
  for (int64_t s = 0; s < S; ++s) {
    float kc[N ? N : kMaxWidth], vc[N ? N : kMaxWidth];
    for (int64_t d = 0; d < K; ++d) kc[d] = k[s * K + d], vc[d] = v[s * K + d];
#pragma omp simd
    for (int64_t t = 0; t < P; ++t) {
      float a = 0.0f, b = 0.0f;
      for (int64_t d = 0; d < K; ++d) a += kc[d] * qt[d * P + t], b += vc[d] * gt[d * P + t];
      const float e = exp_approx(a - L[t]);
      p[t] = e;
      ds[t] = e * (b - D[t]);
    }
    for (int64_t d = 0; d < K; ++d) {
      const float* __restrict qd = qt + d * P;
      const float* __restrict gd = gt + d * P;
      float* __restrict dqd = dqt + d * P;
      const float c = kc[d];
      float key = 0.0f, value = 0.0f;
#pragma omp simd reduction(+ : key, value)
      for (int64_t t = 0; t < P; ++t) {
        dqd[t] += c * ds[t];
        key += ds[t] * qd[t];
        value += p[t] * gd[t];
      }
      dk[s * K + d] = key;
      dv[s * K + d] = value;
    }
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < K; ++d) dq[t * K + d] = dqt[d * P + t];
}

using Array = ffi::Buffer<ffi::F32>;
using Result = ffi::ResultBuffer<ffi::F32>;

// T, S, K and the slice count of q [..., T, K] and k, v [..., S, K] into `shape`, or an error.
ffi::Error sizes(const Array& q, const Array& k, const Array& v, std::array<int64_t, 4>& shape) {
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions();
  const bool ranks = qd.size() >= 2 && qd.size() == kd.size() && kd.size() == vd.size();
  if (!ranks || !std::equal(kd.begin(), kd.end(), vd.begin()) ||
      !std::equal(qd.begin(), qd.end() - 2, kd.begin()) || qd.back() != kd.back())
    return ffi::Error::InvalidArgument("attention: q [..., T, K] and k, v [..., S, K] disagree");
  const int64_t T = qd[qd.size() - 2], S = kd[kd.size() - 2], K = qd.back();
  if (K > kMaxWidth) return ffi::Error::InvalidArgument("attention: heads wider than 256");
  const int64_t slices = T * K == 0 ? 0 : static_cast<int64_t>(q.element_count()) / (T * K);
  shape = {T, S, K, S == 0 ? 0 : slices};
  return ffi::Error::Success();
}

// Whether `buffer` has the dimensions of `like` less its last `drop`.
template <typename B>
bool shaped_like(const B& buffer, const Array& like, size_t drop = 0) {
  const auto a = buffer.dimensions(), b = like.dimensions();
  return a.size() + drop == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

// Runs Run<K> for head widths K up to 8 (a constant inside, so the loops over it
// unroll and their sums stay in registers), Run<0> with the width as a variable beyond.
template <template <int> class Run, typename... Args>
void for_width(int64_t K, Args&&... args) {
  switch (K) {
    case 1: return Run<1>::run(K, args...);
    case 2: return Run<2>::run(K, args...);
    case 3: return Run<3>::run(K, args...);
    case 4: return Run<4>::run(K, args...);
    case 5: return Run<5>::run(K, args...);
    case 6: return Run<6>::run(K, args...);
    case 7: return Run<7>::run(K, args...);
    case 8: return Run<8>::run(K, args...);
    default: return Run<0>::run(K, args...);
  }
}

template <int N>
struct ForwardSlices {
  static void run(int64_t K, ffi::ThreadPool& pool, const float* q, const float* k,
                  const float* v, float* o, float* lse, int64_t T, int64_t S, int64_t slices) {
    parallel_for(pool, slices, forward_scratch(T, S, K), [=](int64_t i, float* scratch) {
      forward_slice<N>(q + i * T * K, k + i * S * K, v + i * S * K, o + i * T * K, lse + i * T,
                       T, S, K, scratch);
    });
  }
};

template <int N>
struct BackwardSlices {
  static void run(int64_t K, ffi::ThreadPool& pool, const float* q, const float* k,
                  const float* v, const float* o, const float* lse, const float* g, float* dq,
                  float* dk, float* dv, int64_t T, int64_t S, int64_t slices) {
    parallel_for(pool, slices, backward_scratch(T, K), [=](int64_t i, float* scratch) {
      backward_slice<N>(q + i * T * K, k + i * S * K, v + i * S * K, o + i * T * K, lse + i * T,
                        g + i * T * K, dq + i * T * K, dk + i * S * K, dv + i * S * K, T, S, K,
                        scratch);
    });
  }
};

ffi::Error Forward(ffi::ThreadPool pool, Array q, Array k, Array v, Result o, Result lse) {
  std::array<int64_t, 4> shape;
  if (ffi::Error error = sizes(q, k, v, shape); error.failure()) return error;
  if (!shaped_like(*o, q) || !shaped_like(*lse, q, 1))
    return ffi::Error::InvalidArgument("attention forward: o [..., T, K], lse [..., T] unlike q");
  const auto [T, S, K, slices] = shape;
  try {
    for_width<ForwardSlices>(K, pool, q.typed_data(), k.typed_data(), v.typed_data(),
                             o->typed_data(), lse->typed_data(), T, S, slices);
  } catch (const std::exception& error) {
    return ffi::Error::Internal(std::string("attention forward: ") + error.what());
  }
  return ffi::Error::Success();
}

ffi::Error Backward(ffi::ThreadPool pool, Array q, Array k, Array v, Array o, Array lse, Array g,
                    Result dq, Result dk, Result dv) {
  std::array<int64_t, 4> shape;
  if (ffi::Error error = sizes(q, k, v, shape); error.failure()) return error;
  if (!shaped_like(o, q) || !shaped_like(g, q) || !shaped_like(lse, q, 1) ||
      !shaped_like(*dq, q) || !shaped_like(*dk, k) || !shaped_like(*dv, k))
    return ffi::Error::InvalidArgument(
        "attention backward: o, g, dq [..., T, K], lse [..., T] unlike q or dk, dv unlike k");
  const auto [T, S, K, slices] = shape;
  try {
    for_width<BackwardSlices>(K, pool, q.typed_data(), k.typed_data(), v.typed_data(),
                              o.typed_data(), lse.typed_data(), g.typed_data(), dq->typed_data(),
                              dk->typed_data(), dv->typed_data(), T, S, slices);
  } catch (const std::exception& error) {
    return ffi::Error::Internal(std::string("attention backward: ") + error.what());
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(AttentionForward, Forward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Array>()   // q
                                  .Arg<Array>()   // k
                                  .Arg<Array>()   // v
                                  .Ret<Array>()   // o
                                  .Ret<Array>());  // lse

XLA_FFI_DEFINE_HANDLER_SYMBOL(AttentionBackward, Backward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Array>()   // q
                                  .Arg<Array>()   // k
                                  .Arg<Array>()   // v
                                  .Arg<Array>()   // o
                                  .Arg<Array>()   // lse
                                  .Arg<Array>()   // g
                                  .Ret<Array>()   // dq
                                  .Ret<Array>()   // dk
                                  .Ret<Array>());  // dv
