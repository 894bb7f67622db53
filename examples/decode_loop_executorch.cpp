// The seed's ExecuTorch decode loop in C++: zero-copy, the static cache written in place.
//
// Export first:
//   hfexport export tiny:llama --generate --multi-token-decode --static-cache 64 --format executorch \
//       --no-llm-runner -o out/llama-et
//   (--no-llm-runner: the cache as method inputs, which this loop binds; the default is the program
//   ExecuTorch's own LLM runner loads, its cache inside)
//
// Build against ExecuTorch 1.4.1 (runtime, portable kernels, XNNPACK backend, extension_tensor,
// extension_data_loader), then: ./decode_loop_executorch out/llama-et/decode.pte 1,2,3,4 16
//
// Not built in CI (no ExecuTorch C++ toolchain there). Its Python twin,
// decode_loop_executorch.py, runs the same graph in CI and reads the cache back from the outputs,
// because the Python runtime cannot bind outputs to caller memory (`set_output_data_ptr`).
//
// Inputs are [input_ids, attention_mask, position_ids, cache x N]; outputs are
// [returned cache x N, logits, mutated cache x N]; shapes and sizes come from method_meta.

#include <executorch/extension/data_loader/file_data_loader.h>
#include <executorch/extension/tensor/tensor_ptr.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/program.h>
#include <executorch/runtime/platform/runtime.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

using namespace executorch::runtime;
using executorch::aten::ScalarType;
using executorch::extension::FileDataLoader;
using executorch::extension::make_tensor_ptr;
using executorch::extension::TensorPtr;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s decode.pte [prompt ids 1,2,3] [max new tokens]\n", argv[0]);
    return 2;
  }
  runtime_init();
  std::vector<int64_t> prompt;
  std::stringstream ids(argc > 2 ? argv[2] : "1,2,3,4");
  for (std::string item; std::getline(ids, item, ',');) prompt.push_back(std::stoll(item));
  const int64_t max_new_tokens = argc > 3 ? std::stoll(argv[3]) : 16;

  // load the exported decode and its `forward` method (Result error-checks elided for brevity)
  auto loader = FileDataLoader::from(argv[1]);
  auto program = Program::load(&loader.get());

  // method-execution memory: a fixed arena for bookkeeping + one buffer per the method's memory plan
  static std::array<uint8_t, 4 * 1024 * 1024> arena;
  MemoryAllocator method_allocator(arena.size(), arena.data());
  auto meta = program->method_meta("forward");
  std::vector<std::vector<uint8_t>> planned(meta->num_memory_planned_buffers());
  std::vector<Span<uint8_t>> planned_spans;
  for (size_t i = 0; i < planned.size(); ++i) {
    planned[i].resize(meta->memory_planned_buffer_size(i).get());
    planned_spans.push_back({planned[i].data(), planned[i].size()});
  }
  HierarchicalAllocator planned_allocator({planned_spans.data(), planned_spans.size()});
  MemoryManager memory_manager(&method_allocator, &planned_allocator);
  auto decode = std::move(program->load_method("forward", &memory_manager).get());

  // shapes and sizes come from method_meta: no external config
  const size_t num_cache_tensors = meta->num_inputs() - 3;
  const size_t logits_out_idx = num_cache_tensors;
  std::vector<TensorPtr> cache_tensor;
  std::vector<size_t> cache_nbytes(num_cache_tensors), cache_out_idx(num_cache_tensors);
  int64_t max_cache_len = 0;
  for (size_t i = 0; i < num_cache_tensors; ++i) {
    auto info = meta->input_tensor_meta(3 + i).get();
    std::vector<executorch::aten::SizesType> sizes(info.sizes().begin(), info.sizes().end());
    if (sizes.size() == 4) max_cache_len = sizes[2];
    cache_nbytes[i] = info.nbytes();
    cache_out_idx[i] = num_cache_tensors + 1 + i;  // mutated cache = the last N outputs
    // one set of StaticCache buffers (K/V + per-layer write counters), zeroed: an empty cache
    cache_tensor.push_back(make_tensor_ptr(sizes, std::vector<uint8_t>(info.nbytes(), 0), {}, {},
                                           info.scalar_type()));
  }
  auto logits_info = meta->output_tensor_meta(logits_out_idx).get();
  const int64_t vocab_size = logits_info.sizes()[logits_info.sizes().size() - 1];
  std::vector<float> logits_data(logits_info.nbytes() / sizeof(float));

  auto causal_mask = [&](int64_t first, int64_t count) {  // [1, 1, count, max_cache_len] bool
    std::vector<uint8_t> mask(count * max_cache_len);
    for (int64_t q = 0; q < count; ++q)
      for (int64_t k = 0; k < max_cache_len; ++k) mask[q * max_cache_len + k] = k <= first + q;
    return make_tensor_ptr({1, 1, static_cast<int32_t>(count), static_cast<int32_t>(max_cache_len)},
                           std::move(mask), {}, {}, ScalarType::Bool);
  };
  auto forward = [&](TensorPtr input_ids, TensorPtr mask, TensorPtr position_ids, int64_t count) {
    decode.set_input(EValue(*input_ids), 0);
    decode.set_input(EValue(*mask), 1);
    decode.set_input(EValue(*position_ids), 2);
    for (size_t i = 0; i < num_cache_tensors; ++i) decode.set_input(EValue(*cache_tensor[i]), 3 + i);
    // bind each mutated-cache output onto that same input tensor's data: the write lands in place
    for (size_t i = 0; i < num_cache_tensors; ++i)
      decode.set_output_data_ptr(cache_tensor[i]->mutable_data_ptr(), cache_nbytes[i], cache_out_idx[i]);
    decode.set_output_data_ptr(logits_data.data(), logits_data.size() * sizeof(float), logits_out_idx);
    decode.execute();  // cache updated in place; logits written to logits_data
    const float* last = logits_data.data() + (count - 1) * vocab_size;  // greedy pick at the last position
    int64_t best = 0;
    for (int64_t v = 1; v < vocab_size; ++v) best = last[v] > last[best] ? v : best;
    return best;
  };

  // prefill the whole prompt, then decode one token per step: the cache carries in place
  const int64_t prompt_len = static_cast<int64_t>(prompt.size());
  std::vector<int64_t> positions(prompt_len);
  for (int64_t i = 0; i < prompt_len; ++i) positions[i] = i;
  int64_t next_token = forward(make_tensor_ptr({1, static_cast<int32_t>(prompt_len)}, prompt),
                               causal_mask(0, prompt_len),
                               make_tensor_ptr({1, static_cast<int32_t>(prompt_len)}, positions), prompt_len);
  std::printf("%lld", static_cast<long long>(next_token));
  for (int64_t position = prompt_len; position < std::min(prompt_len + max_new_tokens - 1, max_cache_len); ++position) {
    next_token = forward(make_tensor_ptr({1, 1}, std::vector<int64_t>{next_token}), causal_mask(position, 1),
                         make_tensor_ptr({1, 1}, std::vector<int64_t>{position}), 1);
    std::printf(",%lld", static_cast<long long>(next_token));
  }
  std::printf("\n");
  return 0;
}
