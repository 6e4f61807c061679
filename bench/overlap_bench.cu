// Microbenchmark: does a memory-bound pass (AdamW's traffic: four f32 streams read, three
// written) gain from running beside float8 GEMMs, under the GPU's power cap?
//
// A training step is a run of compute-bound GEMMs (held at the power cap, the clock lowered) and
// memory-bound passes (bandwidth-bound, not clock-bound). This times, with the GPU held busy long
// enough to reach its cap, each alone and both at once: the GEMMs on one stream, the pass on
// another, either sharing the GPU freely or with the pass held to S SMs (one 1024-thread block
// per SM) and cuBLASLt told to plan its GEMMs for the rest (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET).
// "gain" is the time both would take one after the other, from the alone runs, over the time
// they take together: above 1, overlapping pays.
//
// Usage: overlap_bench [--seconds S] [--elements N] [--m M --n N --k K]
#include <cublasLt.h>
#include <cuda_fp8.h>

#include <string>
#include <vector>

#include "bench_support.cuh"
#include "train/device_monitor.h"

using namespace smelt;
using bench::check;

namespace {

void check_lt(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "overlap_bench: %s failed: status %d\n", what, int(status));
    std::exit(1);
  }
}

// AdamW's traffic and arithmetic per element, without its bookkeeping.
__global__ void __launch_bounds__(1024) memory_pass(float4* p, const float4* g, float4* m, float4* v, int64_t quads) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < quads; i += int64_t(gridDim.x) * blockDim.x) {
    float4 pp = p[i], gg = g[i], mm = m[i], vv = v[i];
    float* pe = &pp.x;
    const float* ge = &gg.x;
    float* me = &mm.x;
    float* ve = &vv.x;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      me[e] = 0.9f * me[e] + 0.1f * ge[e];
      ve[e] = 0.95f * ve[e] + 0.05f * ge[e] * ge[e];
      pe[e] = pe[e] * 0.9999f - 1e-4f * me[e] / (sqrtf(ve[e]) + 1e-8f);
    }
    p[i] = pp;
    m[i] = mm;
    v[i] = vv;
  }
}

__global__ void absolute(float* data, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    data[i] = fabsf(data[i]);
}

struct Gemm {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  void* workspace = nullptr;
  size_t workspace_bytes = 64u << 20;
  const void *a_data = nullptr, *b_data = nullptr;
  void* d_data = nullptr;
  float alpha = 1.0f, beta = 0.0f;

  // D (m x n, bf16, column-major) = A^T B with A (k x m) and B (k x n) e4m3, column-major,
  // per-tensor scales of 1; planned for `sm_target` SMs (0: all).
  Gemm(int64_t m, int64_t n, int64_t k, const void* a_codes, const void* b_codes, void* out, const float* scale,
       int sm_target) {
    check_lt(cublasLtCreate(&handle), "cublasLtCreate");
    check_lt(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
    const cublasOperation_t transpose = CUBLAS_OP_T, none = CUBLAS_OP_N;
    check_lt(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose)), "TRANSA");
    check_lt(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &none, sizeof(none)), "TRANSB");
    check_lt(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale, sizeof(scale)), "A scale");
    check_lt(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale, sizeof(scale)), "B scale");
    if (sm_target > 0) {
      const int32_t target = sm_target;
      check_lt(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &target, sizeof(target)),
               "SM_COUNT_TARGET");
    }
    check_lt(cublasLtMatrixLayoutCreate(&a, CUDA_R_8F_E4M3, uint64_t(k), uint64_t(m), k), "layout A");
    check_lt(cublasLtMatrixLayoutCreate(&b, CUDA_R_8F_E4M3, uint64_t(k), uint64_t(n), k), "layout B");
    check_lt(cublasLtMatrixLayoutCreate(&d, CUDA_R_16BF, uint64_t(m), uint64_t(n), m), "layout D");
    check(cudaMalloc(&workspace, workspace_bytes), "cudaMalloc workspace");
    cublasLtMatmulPreference_t preference;
    check_lt(cublasLtMatmulPreferenceCreate(&preference), "PreferenceCreate");
    check_lt(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                  sizeof(workspace_bytes)),
             "workspace preference");
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    check_lt(cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, d, d, preference, 1, &result, &found), "heuristic");
    if (found == 0) {
      std::fprintf(stderr, "overlap_bench: no cuBLASLt algorithm for the float8 GEMM\n");
      std::exit(1);
    }
    algo = result.algo;
    cublasLtMatmulPreferenceDestroy(preference);
    a_data = a_codes;
    b_data = b_codes;
    d_data = out;
  }
  ~Gemm() {
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(d);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(handle);
    cudaFree(workspace);
  }
  void run(cudaStream_t stream) {
    check_lt(cublasLtMatmul(handle, desc, &alpha, a_data, a, b_data, b, &beta, d_data, d, d_data, d, &algo, workspace,
                            workspace_bytes, stream),
             "cublasLtMatmul");
  }
};

struct Timer {
  cudaEvent_t start, a_done, b_done;
  Timer() {
    check(cudaEventCreate(&start), "event");
    check(cudaEventCreate(&a_done), "event");
    check(cudaEventCreate(&b_done), "event");
  }
};

double elapsed_ms(cudaEvent_t from, cudaEvent_t to) {
  float ms = 0;
  check(cudaEventElapsedTime(&ms, from, to), "cudaEventElapsedTime");
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 2.0;
  int64_t elements = int64_t(1) << 29;  // 512 Mi f32 per stream: 8 GiB read, 6 GiB written per pass
  int64_t m = 8192, n = 14336, k = 4096;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--seconds" && i + 1 < argc) seconds = std::atof(argv[++i]);
    else if (flag == "--elements" && i + 1 < argc) elements = std::atoll(argv[++i]);
    else if (flag == "--m" && i + 1 < argc) m = std::atoll(argv[++i]);
    else if (flag == "--n" && i + 1 < argc) n = std::atoll(argv[++i]);
    else if (flag == "--k" && i + 1 < argc) k = std::atoll(argv[++i]);
    else {
      std::fprintf(stderr, "usage: overlap_bench [--seconds S] [--elements N] [--m M --n N --k K]\n");
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("overlap_bench: no CUDA device, skipped\n");
    return 0;
  }
  elements = elements / 4 * 4;
  cudaDeviceProp properties{};
  check(cudaGetDeviceProperties(&properties, 0), "cudaGetDeviceProperties");
  const int sms = properties.multiProcessorCount;
  char bus_id[32] = {};
  check(cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), 0), "cudaDeviceGetPCIBusId");
  DeviceMonitor monitor(bus_id, 20);

  cudaStream_t gemm_stream, pass_stream;
  check(cudaStreamCreateWithFlags(&gemm_stream, cudaStreamNonBlocking), "stream");
  check(cudaStreamCreateWithFlags(&pass_stream, cudaStreamNonBlocking), "stream");
  void *a_codes, *b_codes, *out;
  float* scale;
  check(cudaMalloc(&a_codes, size_t(k * m)), "cudaMalloc A");
  check(cudaMalloc(&b_codes, size_t(k * n)), "cudaMalloc B");
  check(cudaMalloc(&out, size_t(m * n) * 2), "cudaMalloc D");
  check(cudaMalloc(&scale, sizeof(float)), "cudaMalloc scale");
  // Random codes (any byte but the NaN codes 0x7f/0xff): fill as bf16 noise, then mask.
  bench::fill_random<<<1024, 256, 0, gemm_stream>>>(a_codes, DType::bf16, k * m / 2, 11, 1.0f);
  bench::fill_random<<<1024, 256, 0, gemm_stream>>>(b_codes, DType::bf16, k * n / 2, 12, 1.0f);
  check(cudaMemsetAsync(out, 0xff, size_t(m * n) * 2, gemm_stream), "poison D");
  const float one = 1.0f;
  check(cudaMemcpy(scale, &one, sizeof(float), cudaMemcpyHostToDevice), "scale");
  std::vector<float*> state(4);  // p, g, m, v
  for (float*& s : state) check(cudaMalloc(&s, size_t(elements) * sizeof(float)), "cudaMalloc state");
  for (int s = 0; s < 4; ++s) bench::fill_random<<<1024, 256, 0, pass_stream>>>(state[s], DType::f32, elements, 20 + s, 0.5f);
  check(cudaStreamSynchronize(gemm_stream), "sync");
  check(cudaStreamSynchronize(pass_stream), "sync");
  {  // clear the top exponent bit of every e4m3 code: |value| < 2, never a NaN
    std::vector<uint8_t> host(size_t(k * m));
    check(cudaMemcpy(host.data(), a_codes, host.size(), cudaMemcpyDeviceToHost), "copy A");
    for (uint8_t& byte : host) byte &= 0xbf;
    check(cudaMemcpy(a_codes, host.data(), host.size(), cudaMemcpyHostToDevice), "copy A back");
    host.resize(size_t(k * n));
    check(cudaMemcpy(host.data(), b_codes, host.size(), cudaMemcpyDeviceToHost), "copy B");
    for (uint8_t& byte : host) byte &= 0xbf;
    check(cudaMemcpy(b_codes, host.data(), host.size(), cudaMemcpyHostToDevice), "copy B back");
    absolute<<<1024, 256>>>(state[3], elements);  // v, the second moment, is never negative
    check(cudaGetLastError(), "absolute");
  }
  check(cudaFuncSetAttribute(memory_pass, cudaFuncAttributeMaxDynamicSharedMemorySize, 160 * 1024), "smem attribute");

  const double gemm_tflop = 2.0 * double(m) * double(n) * double(k) / 1e12;
  const double pass_gb = double(elements) * 4.0 * 7.0 / 1e9;
  // Launches the pass on `blocks` blocks (0: as many as fill the GPU, 4 x 512 per SM); with a
  // block count, 1024 threads and 160 KB of shared memory hold each block to an SM of its own.
  auto pass = [&](int blocks) {
    if (blocks == 0)
      memory_pass<<<sms * 4, 512, 0, pass_stream>>>(reinterpret_cast<float4*>(state[0]), reinterpret_cast<float4*>(state[1]),
                                                 reinterpret_cast<float4*>(state[2]), reinterpret_cast<float4*>(state[3]),
                                                 elements / 4);
    else
      memory_pass<<<blocks, 1024, 160 * 1024, pass_stream>>>(
          reinterpret_cast<float4*>(state[0]), reinterpret_cast<float4*>(state[1]), reinterpret_cast<float4*>(state[2]),
          reinterpret_cast<float4*>(state[3]), elements / 4);
    check(cudaGetLastError(), "memory_pass");
  };

  Timer timer;
  struct Row {
    std::string what;
    double total_ms, gemm_ms_each, pass_ms_each, gain;
    int gemms, passes;
    DeviceReport device;
  };
  std::vector<Row> rows;
  // Runs `gemms` GEMMs and `passes` passes, each kind one after the other on its own stream, the
  // two streams at once; returns the time until both are done and each stream's own time.
  auto run = [&](Gemm* gemm, int gemms, int pass_blocks, int passes, double& gemm_ms, double& pass_ms) {
    check(cudaDeviceSynchronize(), "sync");
    monitor.take();
    check(cudaEventRecord(timer.start, gemm_stream), "record");
    check(cudaStreamWaitEvent(pass_stream, timer.start), "wait");
    for (int i = 0; i < gemms; ++i) gemm->run(gemm_stream);
    for (int i = 0; i < passes; ++i) pass(pass_blocks);
    check(cudaEventRecord(timer.a_done, gemm_stream), "record");
    check(cudaEventRecord(timer.b_done, pass_stream), "record");
    check(cudaDeviceSynchronize(), "sync");
    gemm_ms = gemms > 0 ? elapsed_ms(timer.start, timer.a_done) : 0;
    pass_ms = passes > 0 ? elapsed_ms(timer.start, timer.b_done) : 0;
    return std::max(gemm_ms, pass_ms);
  };

  monitor.start();
  Gemm full(m, n, k, a_codes, b_codes, out, scale, 0);
  // Warm up to the power cap: about `seconds` of GEMMs.
  double gemm_ms = 0, pass_ms = 0;
  run(&full, 20, 0, 0, gemm_ms, pass_ms);
  const double probe_gemm = gemm_ms / 20;
  run(&full, std::max(1, int(seconds * 1000 / probe_gemm)), 0, 0, gemm_ms, pass_ms);
  run(&full, 0, 0, 3, gemm_ms, pass_ms);
  const double probe_pass = pass_ms / 3;
  const int gemm_count = std::max(1, int(seconds * 1000 / probe_gemm));
  const int pass_count = std::max(1, int(seconds * 1000 / probe_pass / 2));  // half the time in passes

  auto alone_gemm = [&](Gemm* gemm, const std::string& what) {
    double g = 0, p = 0;
    const double total = run(gemm, gemm_count, 0, 0, g, p);
    rows.push_back({what, total, g / gemm_count, 0, 0, gemm_count, 0, monitor.take()});
    return g / gemm_count;
  };
  auto alone_pass = [&](int blocks, const std::string& what) {
    double g = 0, p = 0;
    const double total = run(&full, 0, blocks, pass_count, g, p);
    rows.push_back({what, total, 0, p / pass_count, 0, 0, pass_count, monitor.take()});
    return p / pass_count;
  };
  const double gemm_alone = alone_gemm(&full, "GEMMs alone, all SMs");
  const double pass_alone = alone_pass(0, "pass alone, all SMs");
  auto together = [&](Gemm* gemm, int blocks, const std::string& what) {
    double g = 0, p = 0;
    const double total = run(gemm, gemm_count, blocks, pass_count, g, p);
    const double serial = gemm_count * gemm_alone + pass_count * pass_alone;
    rows.push_back({what, total, g / gemm_count, p / pass_count, serial / total, gemm_count, pass_count, monitor.take()});
  };
  together(&full, 0, "together, shared freely");
  for (int held : {8, 16, 24, 32}) {
    if (held >= sms) continue;
    Gemm partial(m, n, k, a_codes, b_codes, out, scale, sms - held);
    alone_pass(held, "pass alone on " + std::to_string(held) + " SMs");
    alone_gemm(&partial, "GEMMs alone, planned for " + std::to_string(sms - held) + " SMs");
    together(&partial, held, "together, pass on " + std::to_string(held) + " SMs");
  }
  monitor.stop();

  std::printf("float8 GEMM %lld x %lld x %lld (%.2f TFLOP each); pass over %lld f32 x 4 (%.1f GB moved each); "
              "%d SMs\n\n",
              (long long)m, (long long)n, (long long)k, gemm_tflop, (long long)elements, pass_gb, sms);
  std::printf("| run | ms | GEMMs | GEMM ms (TFLOPS) | passes | pass ms (GB/s) | gain | SM MHz | W |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const Row& row : rows) {
    char gemm_text[64] = "", pass_text[64] = "", gain_text[16] = "";
    if (row.gemms > 0) std::snprintf(gemm_text, sizeof(gemm_text), "%.3f (%.0f)", row.gemm_ms_each, gemm_tflop / row.gemm_ms_each * 1e3);
    if (row.passes > 0) std::snprintf(pass_text, sizeof(pass_text), "%.2f (%.0f)", row.pass_ms_each, pass_gb / row.pass_ms_each * 1e3);
    if (row.gain > 0) std::snprintf(gain_text, sizeof(gain_text), "%.3f", row.gain);
    std::printf("| %s | %.0f | %d | %s | %d | %s | %s | %.0f | %.0f |\n", row.what.c_str(), row.total_ms, row.gemms,
                gemm_text, row.passes, pass_text, gain_text, row.device.sm_clock_mhz, row.device.power_watts);
  }
  return 0;
}
