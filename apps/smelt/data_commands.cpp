// `smelt prepare` (text -> token shards) and `smelt tokenizer train` (a BPE
// vocabulary from the user's text), with progress on stderr.
#include <cstdio>
#include <iostream>

#include <unistd.h>

#include "commands.h"
#include "data/bpe_trainer.h"
#include "data/prepare.h"

namespace smelt {

namespace {

// Redrawn in place when stderr is a terminal, at most once per whole percent.
void progress_bar(const char* label, double fraction, const std::string& detail) {
  static int last_percent = -1;
  static std::string last_label;
  const int percent = static_cast<int>(fraction * 100);
  if (percent == last_percent && last_label == label) return;
  last_percent = percent;
  last_label = label;
  if (!isatty(fileno(stderr)) && percent != 100) return;
  const int width = 30;
  const int filled = static_cast<int>(fraction * width);
  std::fprintf(stderr, "\r%s [%.*s%*s] %5.1f%% %s   ", label, filled, "##############################", width - filled, "",
               100.0 * fraction, detail.c_str());
  std::fflush(stderr);
}

}  // namespace

int run_prepare(const PrepareCommandOptions& options) {
  PrepareOptions p;
  p.inputs = options.inputs;
  p.output_dir = options.output;
  p.tokenizer = options.tokenizer;
  p.text_field = options.text_field;
  p.validation_fraction = options.validation_fraction;
  PrepareSummary summary = prepare_dataset(p, [](const PrepareProgress& progress) {
    const double fraction = progress.bytes_total ? double(progress.bytes_done) / double(progress.bytes_total) : 0;
    progress_bar("prepare", fraction, std::to_string(progress.documents) + " documents, " + std::to_string(progress.tokens) + " tokens");
  });
  std::fprintf(stderr, "\n");
  std::cout << "prepared " << options.output << ": " << describe(summary) << "\n";
  return 0;
}

int run_tokenizer_train(const TokenizerTrainCommandOptions& options) {
  TrainTokenizerOptions t;
  t.inputs = options.inputs;
  t.output = options.output;
  t.vocab_size = options.vocab_size;
  t.text_field = options.text_field;
  TrainTokenizerSummary summary = train_tokenizer(t, [](const TrainProgress& progress) {
    if (progress.stage == TrainStage::counting) {
      const double fraction = progress.bytes_total ? double(progress.bytes_done) / double(progress.bytes_total) : 0;
      progress_bar("counting", fraction, "");
    } else if (progress.stage == TrainStage::merging) {
      const double fraction = progress.merges_total ? double(progress.merges_done) / double(progress.merges_total) : 0;
      progress_bar("merging ", fraction, std::to_string(progress.merges_done) + " merges");
    }
  });
  std::fprintf(stderr, "\n");
  std::printf("tokenizer %s: %lld tokens from %.1f MB of text (%llu distinct pieces) in %.1f s\n", options.output.c_str(),
              (long long)summary.vocab_size, double(summary.input_bytes) / 1e6,
              (unsigned long long)summary.distinct_pieces, summary.seconds);
  return 0;
}

}  // namespace smelt
