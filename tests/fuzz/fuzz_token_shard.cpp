// Fuzz target: token shards (header validation, then reading every token it claims to hold).
#include <vector>

#include "data/token_shard.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = smelt::fuzzing::input_file(data, size, ".tok");
  smelt::fuzzing::expect_no_crash([&] {
    smelt::TokenShard shard(path, 1 << 17);
    std::vector<int32_t> tokens(static_cast<size_t>(std::min<uint64_t>(shard.size(), 1 << 16)));
    shard.read(0, tokens.size(), tokens.data());
    if (shard.size() > 0) (void)shard.at(shard.size() - 1);
  });
  return 0;
}
