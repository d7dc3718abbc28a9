// Document ids from cumulative offsets (kernels/attention/document_ids.hpp).
#include "kernels/attention/document_ids.hpp"

namespace tilejit::kernels {

using namespace lang;

const Kernel& attention_document_ids() {
  static const Kernel k = kernel("attention_document_ids", [](Builder& kb) {
    constexpr int64_t C = 256;  // tokens a step
    auto Cu = kb.tensor("cu_seqlens", i32, 1), Ids = kb.tensor("doc_ids", i32, 2);
    Tile b = program_id(0);
    Tile start = load(Cu.ptr() + b * Cu.stride(0)), end = load(Cu.ptr() + (b + 1) * Cu.stride(0));
    for_range(start, end, C, [&](Tile t0) {
      Tile t = t0 + arange(0, C);
      store(Ids.ptr() + t * Ids.stride(1), full(i32, {C}, b), t < end);
    });
  });
  return k;
}

}  // namespace tilejit::kernels
