// Which tokens of a sequence each rank of a context-parallel group holds. The sequence is cut into
// chunks (contiguous: W chunks, rank r holds chunk r; zigzag: 2W chunks, rank r holds chunks r and
// 2W-1-r, which balances causal work); a rank's local shard is its chunks back to back, in that
// order. Lengths not divisible by the chunk count give the first S % C chunks one token more, so
// local lengths differ by at most two tokens between ranks (never truncated).
//
// A packed batch of documents (varlen) is cut document by document, as the Long-Context benchmark
// does: every document into the layout's C chunks, chunk c of the layout being chunk c % C of
// document c / C; a rank's shard is its chunks of document 0, then of document 1, ... (the local
// cu_seqlens: shard_cu_seqlens).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tilejit::cp {

enum class Layout { contiguous, zigzag };
const char* name(Layout layout);  // "contiguous", "zigzag"

struct ChunkRange {
  int64_t begin = 0, end = 0;  // global token positions [begin, end)
  int64_t size() const { return end - begin; }
};

class ShardLayout {
 public:
  // Throws std::invalid_argument for world < 1 or a sequence shorter than the chunk count.
  ShardLayout(Layout kind, int world, int64_t seq_len);
  // Documents of these lengths packed back to back, each cut on its own; the same errors for any
  // document (naming it), and for none.
  ShardLayout(Layout kind, int world, const std::vector<int64_t>& document_lengths);

  Layout kind() const { return kind_; }
  int world() const { return world_; }
  int64_t seq_len() const { return seq_len_; }
  int documents() const { return static_cast<int>(doc_begin_.size()) - 1; }
  int chunks_per_document() const { return kind_ == Layout::zigzag ? 2 * world_ : world_; }
  int chunk_count() const { return chunks_per_document() * documents(); }
  int document_of(int c) const { return c / chunks_per_document(); }
  int64_t document_begin(int document) const { return doc_begin_[static_cast<size_t>(document)]; }
  ChunkRange chunk(int c) const;             // global positions of chunk c
  std::vector<int> chunks_of(int rank) const;  // in local order
  int owner(int c) const;                    // the rank holding chunk c
  int64_t local_offset(int c) const;         // where chunk c starts in its owner's shard
  int64_t local_len(int rank) const;
  int64_t max_local_len() const;
  // Global position of every local token of `rank`, in local order.
  std::vector<int64_t> positions(int rank) const;

  std::string describe() const;  // "zigzag W=4 S=32768 (8 chunks of 4096)"

 private:
  Layout kind_;
  int world_;
  int64_t seq_len_;
  std::vector<int64_t> doc_begin_;  // each document's first token, then seq_len
};

// Index maps between a global sequence and the shards (tokens, document ids, any per-token data):
// shard_index(layout, rank)[i] is the global position of local token i (= positions), and
// unshard_index(layout)[p] = {rank, local index} of global position p.
struct ShardSlot {
  int rank = 0;
  int64_t index = 0;
};
std::vector<ShardSlot> unshard_index(const ShardLayout& layout);

// The shard of per-token values (token ids, document ids) that `rank` holds.
template <typename T>
std::vector<T> shard(const ShardLayout& layout, int rank, const std::vector<T>& global) {
  std::vector<T> local;
  for (int64_t p : layout.positions(rank)) local.push_back(global[static_cast<size_t>(p)]);
  return local;
}

// cu_seqlens of a packed batch of documents (B + 1 offsets, 0 first), for a layout that cuts every
// document into the layout's chunks (each document sharded on its own, as the Long-Context
// benchmark does): the local offsets of `rank`'s pieces. Every document must be at least the chunk
// count long (std::invalid_argument otherwise).
std::vector<int32_t> shard_cu_seqlens(Layout kind, int world, int rank, const std::vector<int32_t>& cu_seqlens);

}  // namespace tilejit::cp
