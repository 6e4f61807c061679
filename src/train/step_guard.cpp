// The step guard: non-finite and loss-spike checks between backward and the optimizer.
#include "train/step_guard.h"

#include <cmath>
#include <ostream>
#include <string>

#include "core/error.h"

namespace smelt {

namespace {

GuardAction parse_action(const std::string& text) { return text == "stop" ? GuardAction::stop : GuardAction::skip; }

}  // namespace

StepGuard::StepGuard(const TrainingSection& settings, TrainingProgress& progress)
    : nonfinite_(parse_action(settings.on_nonfinite)),
      spike_(parse_action(settings.on_loss_spike)),
      window_(settings.loss_spike_window),
      zscore_(settings.loss_spike_zscore),
      max_consecutive_skips_(settings.max_consecutive_skips),
      progress_(progress) {}

double StepGuard::spike_zscore(double loss) const {
  const auto& window = progress_.loss_window;
  if (window_ <= 0 || static_cast<int64_t>(window.size()) < window_) return 0;
  double mean = 0;
  for (double l : window) mean += l;
  mean /= static_cast<double>(window.size());
  double variance = 0;
  for (double l : window) variance += (l - mean) * (l - mean);
  const double deviation = std::max(std::sqrt(variance / static_cast<double>(window.size())), 1e-3 * std::fabs(mean));
  return deviation > 0 ? (loss - mean) / deviation : 0;
}

StepVerdict StepGuard::check(int64_t step, double loss, double gradient_norm, std::ostream& log) {
  std::string problem;
  GuardAction action = GuardAction::skip;
  if (!std::isfinite(loss) || !std::isfinite(gradient_norm)) {
    problem = "loss " + std::to_string(loss) + ", gradient norm " + std::to_string(gradient_norm) + " (non-finite)";
    action = nonfinite_;
  } else if (const double z = spike_zscore(loss); z > zscore_) {
    problem = "loss " + std::to_string(loss) + " spikes " + std::to_string(z) + " standard deviations above the last " +
              std::to_string(window_) + " losses";
    action = spike_;
  }
  if (problem.empty()) {
    consecutive_skips_ = 0;
    ++progress_.optimizer_steps;
    if (window_ > 0) {
      progress_.loss_window.push_back(loss);
      if (static_cast<int64_t>(progress_.loss_window.size()) > window_)
        progress_.loss_window.erase(progress_.loss_window.begin());
    }
    return StepVerdict::apply;
  }
  if (action == GuardAction::stop)
    fail(ErrorKind::internal, "step " + std::to_string(step) + ": " + problem +
                                  "; stopping (training.on_nonfinite / on_loss_spike = \"stop\"). Lower optimizer.lr, "
                                  "check the data, or resume from the last checkpoint");
  ++progress_.skipped_steps;
  if (++consecutive_skips_ > max_consecutive_skips_)
    fail(ErrorKind::internal, "step " + std::to_string(step) + ": " + problem + "; " + std::to_string(consecutive_skips_) +
                                  " updates skipped in a row, more than training.max_consecutive_skips = " +
                                  std::to_string(max_consecutive_skips_) +
                                  "; the run is diverging: lower optimizer.lr or check the data");
  log << "step " << step << ": " << problem << "; update skipped (" << progress_.skipped_steps << " so far)\n";
  return StepVerdict::skip;
}

}  // namespace smelt
