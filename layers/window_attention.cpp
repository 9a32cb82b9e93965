// Window attention in one pass per (image, window, head): softmax(q k^T * scale + bias + mask) v for bfloat16
// q, k, v with the scores, the softmax and the sums in float32, on CPUs with AVX512-BF16 (vdpbf16ps).
//
// Built by swin/layers/window_kernel.py (the C++ compiler torch.compile uses on CPU), loaded with ctypes and
// called through the custom op swin::window_attention; no torch headers, so that it builds in a few seconds.
// Threads: OpenMP, the runtime torch itself loaded (libgomp.so.1), so both share one pool.
//
// Per task, K is packed as pairs of channels (vdpbf16ps multiplies and adds pairs) with the keys along the
// vector, and V as pairs of keys with the channels along the vector; a few query rows at a time then compute
// their scores (one 16-lane vector per 16 keys, the rows sharing each load of K), add the position bias and the
// shift mask, take the softmax and multiply by V. Scores and probabilities never leave the core's cache.
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef uint16_t bf16;

namespace {

constexpr int kMaxTiles = 16;     // up to 256 tokens per window (16 vectors of 16 keys)
constexpr int kMaxHeadDim = 128;  // channels per head, a multiple of 32
constexpr int kRows = 4;          // query rows that share each load of K and V

// Two bf16 values as one 32-bit word (the pair vdpbf16ps multiplies), from any 2-byte aligned address.
inline uint32_t pair_at(const bf16* p) {
  uint32_t word;
  memcpy(&word, p, sizeof(word));
  return word;
}

// e^x for x <= 0 (scores minus their maximum), float32, relative error ~1e-7 (Cephes' expf polynomial);
// exactly 0 below -86 (e^-86 is 4e-38 of the largest term, 1): a denormal result would take the slow path of
// every float instruction that touches it (masked scores, -100 below the others, are common). NaN stays NaN.
inline __m512 exp_nonpositive(__m512 x) {
  const __mmask16 kept = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-86.0f), _CMP_NLT_UQ);
  x = _mm512_max_ps(_mm512_set1_ps(-86.0f), x);  // max_ps returns its second operand where one is NaN
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
  return _mm512_maskz_mov_ps(kept, _mm512_scalef_ps(_mm512_add_ps(p, _mm512_set1_ps(1.0f)), n));
}

struct Task {
  const bf16* q;
  const bf16* k;
  const bf16* v;
  int64_t q_row, k_row, v_row;  // element strides between tokens
  const float* bias;            // (N, N) of this head
  const float* mask;            // (N, N) of this window, or null
  bf16* out;                    // token i's d channels at out + i * out_row
  int64_t out_row;
};

// Rows i0 .. i0+R-1 of one task: scores for T vectors of 16 keys, softmax, times V.
template <int T, int R>
inline void query_rows(const Task& task, int i0, int n, int d, float scale, __mmask16 tail, const uint32_t* kp,
                       const uint32_t* vp, bf16* probs) {
  const int stride = T * 16;
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  for (int p = 0; p < d / 2; ++p) {
    __m512i keys[T];
    for (int t = 0; t < T; ++t) keys[t] = _mm512_loadu_si512(kp + p * stride + 16 * t);
    for (int r = 0; r < R; ++r) {
      const __m512i pair = _mm512_set1_epi32(pair_at(task.q + (i0 + r) * task.q_row + 2 * p));
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], (__m512bh)pair, (__m512bh)keys[t]);
    }
  }
  const __m512 vscale = _mm512_set1_ps(scale);
  const __m512 lowest = _mm512_set1_ps(-__builtin_inff());
  // the rows interleaved, so that their reductions (max, sum) overlap instead of waiting on each other
  __m512 top[R];
  for (int r = 0; r < R; ++r) top[r] = lowest;
  for (int t = 0; t < T; ++t) {
    const __mmask16 lanes = t == T - 1 ? tail : (__mmask16)0xFFFF;
    for (int r = 0; r < R; ++r) {
      __m512 add = _mm512_maskz_loadu_ps(lanes, task.bias + (i0 + r) * n + 16 * t);
      if (task.mask) add = _mm512_add_ps(add, _mm512_maskz_loadu_ps(lanes, task.mask + (i0 + r) * n + 16 * t));
      acc[r][t] = _mm512_mask_mov_ps(lowest, lanes, _mm512_fmadd_ps(acc[r][t], vscale, add));
      top[r] = _mm512_max_ps(top[r], acc[r][t]);
    }
  }
  __m512 sum[R];
  for (int r = 0; r < R; ++r) {
    const float largest = _mm512_reduce_max_ps(top[r]);
    // a row masked whole (every score -inf): all terms 0, output 0, as SDPA's CPU kernels give
    top[r] = _mm512_set1_ps(largest == -__builtin_inff() ? 0.0f : largest);
    sum[r] = _mm512_setzero_ps();
  }
  for (int t = 0; t < T; ++t) {
    const __mmask16 lanes = t == T - 1 ? tail : (__mmask16)0xFFFF;
    for (int r = 0; r < R; ++r) {
      const __m512 e = _mm512_maskz_mov_ps(lanes, exp_nonpositive(_mm512_sub_ps(acc[r][t], top[r])));
      sum[r] = _mm512_add_ps(sum[r], e);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(probs + r * stride + 16 * t), (__m256i)_mm512_cvtneps_pbh(e));
    }
  }
  float inverse_sum[R];
  for (int r = 0; r < R; ++r) {
    const float total = _mm512_reduce_add_ps(sum[r]);
    inverse_sum[r] = total == 0.0f ? 0.0f : 1.0f / total;
  }
  const int key_pairs = (n + 1) / 2;
  for (int c = 0; c < d; c += 32) {
    __m512 o[R][2];
    for (int r = 0; r < R; ++r) o[r][0] = o[r][1] = _mm512_setzero_ps();
    for (int jp = 0; jp < key_pairs; ++jp) {
      const __m512i v0 = _mm512_loadu_si512(vp + jp * d + c);
      const __m512i v1 = _mm512_loadu_si512(vp + jp * d + c + 16);
      for (int r = 0; r < R; ++r) {
        const __m512i pair = _mm512_set1_epi32(pair_at(probs + r * stride + 2 * jp));
        o[r][0] = _mm512_dpbf16_ps(o[r][0], (__m512bh)pair, (__m512bh)v0);
        o[r][1] = _mm512_dpbf16_ps(o[r][1], (__m512bh)pair, (__m512bh)v1);
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m512 inv = _mm512_set1_ps(inverse_sum[r]);
      bf16* row = task.out + (i0 + r) * task.out_row + c;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(row), (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(o[r][0], inv)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(row + 16),
                          (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(o[r][1], inv)));
    }
  }
}

template <int T>
void run_task(const Task& task, int n, int d, float scale, uint32_t* kp, uint32_t* vp, bf16* probs) {
  const int stride = T * 16;
  // kp[p * stride + j]: channels 2p, 2p+1 of key j (zero past the last key)
  for (int j = 0; j < n; ++j) {
    const bf16* row = task.k + j * task.k_row;
    for (int p = 0; p < d / 2; ++p) kp[p * stride + j] = pair_at(row + 2 * p);
  }
  for (int p = 0; p < d / 2; ++p)
    for (int j = n; j < stride; ++j) kp[p * stride + j] = 0;
  // vp[jp * d + c]: channel c of keys 2jp and 2jp+1 (zero past the last key)
  for (int jp = 0; jp < (n + 1) / 2; ++jp) {
    const bf16* r0 = task.v + 2 * jp * task.v_row;
    const bf16* r1 = 2 * jp + 1 < n ? r0 + task.v_row : nullptr;
    for (int c = 0; c < d; c += 32) {
      const __m512i a = _mm512_loadu_si512(r0 + c);
      const __m512i b = r1 ? _mm512_loadu_si512(r1 + c) : _mm512_setzero_si512();
      // unpack interleaves within 128-bit lanes: lo holds channels 0-3, 8-11, 16-19, 24-27; hi the others
      const __m512i lo = _mm512_unpacklo_epi16(a, b);
      const __m512i hi = _mm512_unpackhi_epi16(a, b);
      _mm512_storeu_si512(vp + jp * d + c, _mm512_permutex2var_epi64(lo, _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0), hi));
      _mm512_storeu_si512(vp + jp * d + c + 16,
                          _mm512_permutex2var_epi64(lo, _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4), hi));
    }
  }
  const __mmask16 tail = n % 16 ? (__mmask16)((1u << (n % 16)) - 1) : (__mmask16)0xFFFF;
  int i = 0;
  if constexpr (T <= 4) {
    for (; i + kRows <= n; i += kRows) query_rows<T, kRows>(task, i, n, d, scale, tail, kp, vp, probs);
  } else if constexpr (T <= 8) {
    for (; i + 2 <= n; i += 2) query_rows<T, 2>(task, i, n, d, scale, tail, kp, vp, probs);
  }
  for (; i < n; ++i) query_rows<T, 1>(task, i, n, d, scale, tail, kp, vp, probs);
}

struct Call {
  const bf16 *q, *k, *v;
  const int64_t *q_strides, *k_strides, *v_strides;  // (batch, window, head, token) in elements
  int batch, windows, heads, n, d;
  const float* bias;  // (heads, N, N)
  const float* mask;  // (mask_windows, N, N) or null; mask_windows 1 or windows
  int mask_windows;
  float scale;
  bf16* out;  // (batch, windows, N, heads * d), contiguous
};

Task task_of(const Call& c, int64_t t) {
  const int64_t h = t % c.heads, w = (t / c.heads) % c.windows, b = t / ((int64_t)c.heads * c.windows);
  Task task;
  task.q = c.q + b * c.q_strides[0] + w * c.q_strides[1] + h * c.q_strides[2];
  task.k = c.k + b * c.k_strides[0] + w * c.k_strides[1] + h * c.k_strides[2];
  task.v = c.v + b * c.v_strides[0] + w * c.v_strides[1] + h * c.v_strides[2];
  task.q_row = c.q_strides[3];
  task.k_row = c.k_strides[3];
  task.v_row = c.v_strides[3];
  task.bias = c.bias + h * (int64_t)c.n * c.n;
  task.mask = c.mask ? c.mask + (c.mask_windows == 1 ? 0 : w) * (int64_t)c.n * c.n : nullptr;
  task.out_row = (int64_t)c.heads * c.d;
  task.out = c.out + (b * c.windows + w) * (int64_t)c.n * task.out_row + h * c.d;
  return task;
}

// The next task's q, k and v rows into L2 while this one computes (they are strided: one cache line of a
// row holds one head's channels).
void prefetch(const Task& task, int n, int d) {
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < d; c += 32) {
      _mm_prefetch(reinterpret_cast<const char*>(task.q + i * task.q_row + c), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(task.k + i * task.k_row + c), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(task.v + i * task.v_row + c), _MM_HINT_T1);
    }
}

template <int T>
int run(const Call& c, int threads) {
  const int64_t tasks = (int64_t)c.batch * c.windows * c.heads;
  int failed = 0;
  // tasks in (image, window, head) order: neighbours read the same token rows
#pragma omp parallel num_threads(threads)
  {
    uint32_t* kp = static_cast<uint32_t*>(aligned_alloc(64, sizeof(uint32_t) * (kMaxHeadDim / 2) * T * 16));
    uint32_t* vp = static_cast<uint32_t*>(aligned_alloc(64, sizeof(uint32_t) * (T * 8) * kMaxHeadDim));
    bf16* probs = static_cast<bf16*>(aligned_alloc(64, sizeof(bf16) * kRows * T * 16));
    if (!kp || !vp || !probs) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tasks; ++t) {
      int stop;
#pragma omp atomic read
      stop = failed;
      if (stop) continue;
      if (t + 1 < tasks) prefetch(task_of(c, t + 1), c.n, c.d);
      run_task<T>(task_of(c, t), c.n, c.d, c.scale, kp, vp, probs);
    }
    free(kp);
    free(vp);
    free(probs);
  }
  return failed ? 3 : 0;
}

}  // namespace

// 0 on success; 1: head_dim not a multiple of 32 or above 128; 2: more than 256 tokens; 3: out of memory.
extern "C" int swin_window_attention_bf16(const bf16* q, const bf16* k, const bf16* v, const int64_t* q_strides,
                                          const int64_t* k_strides, const int64_t* v_strides, int batch,
                                          int windows, int heads, int n, int d, const float* bias,
                                          const float* mask, int mask_windows, float scale, bf16* out,
                                          int threads) {
  if (d % 32 || d > kMaxHeadDim || d < 32) return 1;
  if (n < 1 || n > kMaxTiles * 16) return 2;
  const Call c{q, k, v, q_strides, k_strides, v_strides, batch, windows, heads, n, d, bias, mask, mask_windows,
               scale, out};
  switch ((n + 15) / 16) {
#define SWIN_TILES(T) \
  case T:             \
    return run<T>(c, threads);
    SWIN_TILES(1) SWIN_TILES(2) SWIN_TILES(3) SWIN_TILES(4) SWIN_TILES(5) SWIN_TILES(6) SWIN_TILES(7) SWIN_TILES(8)
    SWIN_TILES(9) SWIN_TILES(10) SWIN_TILES(11) SWIN_TILES(12) SWIN_TILES(13) SWIN_TILES(14) SWIN_TILES(15)
    SWIN_TILES(16)
#undef SWIN_TILES
  }
  return 2;
}
