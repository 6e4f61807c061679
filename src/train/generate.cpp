// Sampling text from a trained model with the forward steps of a one-sequence plan.
#include "train/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/numerics.h"
#include "core/random.h"
#include "data/tokenizer.h"
#include "train/backends.h"
#include "train/executor.h"
#include "train/model_weights.h"

namespace smelt {

namespace {

int32_t sample(const std::vector<float>& logits, double temperature, double top_p, Random& random) {
  const size_t v = logits.size();
  if (temperature <= 0) return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  const float maximum = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(v);
  double total = 0;
  for (size_t i = 0; i < v; ++i) total += p[i] = std::exp((logits[i] - maximum) / temperature);
  std::vector<size_t> order(v);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
  // The nucleus: the most likely ids whose mass first reaches top_p.
  double mass = 0;
  size_t keep = 0;
  while (keep < v && (keep == 0 || mass < top_p * total)) mass += p[order[keep++]];
  double pick = random.uniform() * mass;
  for (size_t k = 0; k < keep; ++k) {
    pick -= p[order[k]];
    if (pick <= 0) return static_cast<int32_t>(order[k]);
  }
  return static_cast<int32_t>(order[keep - 1]);
}

}  // namespace

std::string generate(const GenerateOptions& options, const std::function<void(const std::string&)>& on_text) {
  if (options.max_tokens < 0) fail(ErrorKind::config, "--max-tokens must be at least 0");
  if (options.top_p <= 0 || options.top_p > 1) fail(ErrorKind::config, "--top-p must be in (0, 1]");
  SavedModel saved = load_weights_from(options.checkpoint, "--checkpoint", options.tokenizer);
  if (options.tokenizer.empty() && saved.tokenizer.empty())
    fail(ErrorKind::config, "--checkpoint '" + options.checkpoint + "' records no tokenizer (a Hugging Face folder); "
                            "pass --tokenizer, e.g. the folder's original/tokenizer.model");
  auto tokenizer = load_tokenizer(options.tokenizer.empty() ? saved.tokenizer : options.tokenizer);
  auto backend = make_backend(options.device);

  PlanOptions plan_options;
  plan_options.shape = {1, saved.seq_len};
  plan_options.compute_dtype = DType::f32;
  plan_options.loss_chunk_tokens = 1;
  plan_options.forward_only = true;
  WorkspaceShape w;
  w.tokens = saved.seq_len;
  w.seq_len = saved.seq_len;
  w.batch = 1;
  w.max_rows = w.max_inner = w.max_cols = std::max({saved.seq_len, saved.model.vocab_size, saved.model.ffn_dim, saved.model.dim});
  w.heads = saved.model.n_heads;
  w.kv_heads = saved.model.n_kv_heads;
  w.head_dim = saved.model.head_dim();
  w.compute_dtype = DType::f32;
  plan_options.backend_workspace_bytes = backend->workspace_bytes(w);
  StepPlan plan = build_step_plan(saved.model, plan_options);
  Executor executor(plan, *backend);
  executor.load_parameters(saved.parameters.data());

  std::vector<int32_t> context = {tokenizer->bos_id()};
  for (int32_t id : tokenizer->encode(options.prompt)) context.push_back(id);
  const auto T = static_cast<size_t>(saved.seq_len);
  std::vector<int32_t> window(T), unused_targets(T, 0);
  std::vector<float> logits(static_cast<size_t>(saved.model.vocab_size));
  Random random(options.seed, 3);
  std::vector<int32_t> generated;
  std::string text;
  OptimizerSettings no_optimizer;
  const TensorView output_weight = ParameterLayout::slice(executor.view(plan.parameters), executor.layout().output());

  for (int64_t produced = 0; produced < options.max_tokens; ++produced) {
    const size_t start = context.size() > T ? context.size() - T : 0;
    const size_t length = context.size() - start;
    std::fill(window.begin(), window.end(), tokenizer->eos_id());
    std::copy(context.begin() + static_cast<std::ptrdiff_t>(start), context.end(), window.begin());
    executor.load_batch(window.data(), unused_targets.data());
    for (const auto& step : plan.steps)
      if (step.kind == StepKind::embedding_forward || step.kind == StepKind::layer_forward ||
          step.kind == StepKind::final_norm_forward)
        executor.run_step(step, no_optimizer);
    GemmArgs head;
    head.a = executor.view(plan.final_norm_out).row_slice(static_cast<int64_t>(length) - 1, 1);
    head.b = output_weight;
    head.transpose_b = true;
    head.out = executor.view(plan.logits).row_slice(0, 1);
    backend->gemm(head);
    if (head.out.dtype == DType::bf16) {  // the plan's logits are in the compute dtype
      std::vector<uint16_t> bits(logits.size());
      backend->copy_to_host(bits.data(), head.out);
      for (size_t i = 0; i < bits.size(); ++i) logits[i] = bf16_to_float(bits[i]);
    } else {
      backend->copy_to_host(logits.data(), head.out);
    }
    const int32_t next = sample(logits, options.temperature, options.top_p, random);
    if (next == tokenizer->eos_id() || next >= tokenizer->vocab_size()) break;
    if (next == tokenizer->bos_id()) continue;
    context.push_back(next);
    generated.push_back(next);
    std::string decoded = tokenizer->decode(generated);
    if (decoded.size() > text.size()) {
      on_text(decoded.substr(text.size()));
      text = decoded;
    }
  }
  return text;
}

}  // namespace smelt
