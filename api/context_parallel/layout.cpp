#include "api/context_parallel/layout.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace tilejit::cp {

const char* name(Layout layout) { return layout == Layout::zigzag ? "zigzag" : "contiguous"; }

ShardLayout::ShardLayout(Layout kind, int world, int64_t seq_len) : kind_(kind), world_(world), seq_len_(seq_len), doc_begin_{0, seq_len} {
  if (world < 1) throw std::invalid_argument(fmt::format("cp::ShardLayout: world is {}; it must be >= 1", world));
  if (seq_len < chunks_per_document())
    throw std::invalid_argument(fmt::format("cp::ShardLayout: seq_len is {}; a {} layout over {} ranks needs at least {} tokens",
                                            seq_len, name(kind), world, chunks_per_document()));
}

ShardLayout::ShardLayout(Layout kind, int world, const std::vector<int64_t>& document_lengths)
    : kind_(kind), world_(world), seq_len_(0), doc_begin_{0} {
  if (world < 1) throw std::invalid_argument(fmt::format("cp::ShardLayout: world is {}; it must be >= 1", world));
  if (document_lengths.empty()) throw std::invalid_argument("cp::ShardLayout: no documents (give at least one length)");
  for (size_t d = 0; d < document_lengths.size(); ++d) {
    if (document_lengths[d] < chunks_per_document())
      throw std::invalid_argument(fmt::format("cp::ShardLayout: document {} has {} tokens; a {} layout over {} ranks cuts every "
                                              "document into {} chunks, so each needs at least {} tokens",
                                              d, document_lengths[d], name(kind), world, chunks_per_document(), chunks_per_document()));
    seq_len_ += document_lengths[d];
    doc_begin_.push_back(seq_len_);
  }
}

ChunkRange ShardLayout::chunk(int c) const {
  // chunk c % C of document c / C; the first len % C chunks of a document take one token more
  const int C = chunks_per_document(), doc = document_of(c), i = c % C;
  const int64_t len = document_begin(doc + 1) - document_begin(doc);
  const int64_t base = len / C, extra = len % C;
  const int64_t begin = document_begin(doc) + i * base + std::min<int64_t>(i, extra);
  return {begin, begin + base + (i < extra ? 1 : 0)};
}

std::vector<int> ShardLayout::chunks_of(int rank) const {
  std::vector<int> chunks;
  const int C = chunks_per_document();
  for (int doc = 0; doc < documents(); ++doc) {
    chunks.push_back(doc * C + rank);
    if (kind_ == Layout::zigzag) chunks.push_back(doc * C + 2 * world_ - 1 - rank);
  }
  return chunks;
}

int ShardLayout::owner(int c) const {
  const int i = c % chunks_per_document();
  if (kind_ == Layout::zigzag && i >= world_) return 2 * world_ - 1 - i;
  return i;
}

int64_t ShardLayout::local_offset(int c) const {
  int64_t offset = 0;
  for (int own : chunks_of(owner(c))) {
    if (own == c) return offset;
    offset += chunk(own).size();
  }
  return offset;
}

int64_t ShardLayout::local_len(int rank) const {
  int64_t n = 0;
  for (int c : chunks_of(rank)) n += chunk(c).size();
  return n;
}

int64_t ShardLayout::max_local_len() const {
  int64_t n = 0;
  for (int r = 0; r < world_; ++r) n = std::max(n, local_len(r));
  return n;
}

std::vector<int64_t> ShardLayout::positions(int rank) const {
  std::vector<int64_t> p;
  for (int c : chunks_of(rank))
    for (int64_t t = chunk(c).begin; t < chunk(c).end; ++t) p.push_back(t);
  return p;
}

std::string ShardLayout::describe() const {
  if (documents() > 1)
    return fmt::format("{} W={} S={} ({} documents, {} chunks each)", name(kind_), world_, seq_len_, documents(), chunks_per_document());
  return fmt::format("{} W={} S={} ({} chunks of {}{})", name(kind_), world_, seq_len_, chunk_count(), chunk(chunk_count() - 1).size(),
                     seq_len_ % chunk_count() ? "-" + std::to_string(chunk(0).size()) : "");
}

std::vector<ShardSlot> unshard_index(const ShardLayout& layout) {
  std::vector<ShardSlot> slots(static_cast<size_t>(layout.seq_len()));
  for (int r = 0; r < layout.world(); ++r) {
    const std::vector<int64_t> p = layout.positions(r);
    for (size_t i = 0; i < p.size(); ++i) slots[static_cast<size_t>(p[i])] = {r, static_cast<int64_t>(i)};
  }
  return slots;
}

std::vector<int32_t> shard_cu_seqlens(Layout kind, int world, int rank, const std::vector<int32_t>& cu_seqlens) {
  if (cu_seqlens.empty() || cu_seqlens.front() != 0)
    throw std::invalid_argument("cp::shard_cu_seqlens: cu_seqlens must start with 0");
  std::vector<int32_t> local{0};
  for (size_t d = 0; d + 1 < cu_seqlens.size(); ++d) {
    const int64_t len = cu_seqlens[d + 1] - cu_seqlens[d];
    // each document cut on its own; ShardLayout checks it has a token per chunk
    try {
      const ShardLayout doc(kind, world, len);
      local.push_back(static_cast<int32_t>(local.back() + doc.local_len(rank)));
    } catch (const std::invalid_argument&) {
      throw std::invalid_argument(fmt::format("cp::shard_cu_seqlens: document {} has {} tokens; a {} layout over {} ranks needs at least {}",
                                              d, len, name(kind), world, kind == Layout::zigzag ? 2 * world : world));
    }
  }
  return local;
}

}  // namespace tilejit::cp
