// The names of the library kernels' meta-parameters, each spelled once. Kernels read them and
// callers write them through the typed configurations (kernels/attention/config.hpp,
// kernels/gemm_config.hpp, ...), never as string literals of their own.
#pragma once

namespace tilejit::kernels::meta_name {

// shared by several kernels
inline constexpr const char* kDtype = "DTYPE";
inline constexpr const char* kBlockM = "BLOCK_M";
inline constexpr const char* kBlockN = "BLOCK_N";
inline constexpr const char* kBlockK = "BLOCK_K";
inline constexpr const char* kCausal = "CAUSAL";
inline constexpr const char* kPersistent = "PERSISTENT";
inline constexpr const char* kTmaStore = "TMA_STORE";
inline constexpr const char* kStoreOffsetsLate = "STORE_OFFSETS_LATE";
inline constexpr const char* kK0BeforeVLast = "K0_BEFORE_V_LAST";
inline constexpr const char* kOverlapTiles = "OVERLAP_TILES";
inline constexpr const char* kLazyRescale = "LAZY_RESCALE";
inline constexpr const char* kCoordinatesAtUse = "COORDINATES_AT_USE";
inline constexpr const char* kTimeline = "TIMELINE";
inline constexpr const char* kAlign = "ALIGN";
inline constexpr const char* kMmaRegisters = "MMA_REGISTERS";

// attention (kernels/attention/config.hpp)
inline constexpr const char* kHeadDim = "HEAD_DIM";
inline constexpr const char* kBshd = "BSHD";
inline constexpr const char* kVarlen = "VARLEN";
inline constexpr const char* kMask = "MASK";
inline constexpr const char* kScoreMod = "SCORE_MOD";
inline constexpr const char* kDropout = "DROPOUT";
inline constexpr const char* kDropoutBits = "DROPOUT_BITS";
inline constexpr const char* kDropoutWriteBits = "DROPOUT_WRITE_BITS";
inline constexpr const char* kDropoutWordsKeyMajor = "DROPOUT_WORDS_KEY_MAJOR";
inline constexpr const char* kReturnMask = "RETURN_MASK";
inline constexpr const char* kPingpong = "PINGPONG";
inline constexpr const char* kExactNormalize = "EXACT_NORMALIZE";
inline constexpr const char* kPipelineQk = "PIPELINE_QK";
inline constexpr const char* kPipelinePv = "PIPELINE_PV";
inline constexpr const char* kPositiveScale = "POSITIVE_SCALE";
inline constexpr const char* kDropoutAhead = "DROPOUT_AHEAD";
inline constexpr const char* kDropoutPairs = "DROPOUT_PAIRS";
inline constexpr const char* kHeavyFirstSections = "HEAVY_FIRST_SECTIONS";
inline constexpr const char* kRngWarps = "RNG_WARPS";
inline constexpr const char* kRngRegisters = "RNG_REGISTERS";
inline constexpr const char* kRingProducer = "RING_PRODUCER";
inline constexpr const char* kPvPeel = "PV_PEEL";
inline constexpr const char* kPartialTilesOnly = "PARTIAL_TILES_ONLY";
inline constexpr const char* kDqReduction = "DQ_REDUCTION";
inline constexpr const char* kQDescending = "Q_DESCENDING";
inline constexpr const char* kMaskedBlocksApart = "MASKED_BLOCKS_APART";
inline constexpr const char* kRowsAhead = "ROWS_AHEAD";
inline constexpr const char* kLseInRing = "LSE_IN_RING";
inline constexpr const char* kAccumulate = "ACCUMULATE";
inline constexpr const char* kDqWriter = "DQ_WRITER";
inline constexpr const char* kProducerRegisters = "PRODUCER_REGISTERS";
inline constexpr const char* kDescriptorsAtUse = "DESCRIPTORS_AT_USE";
inline constexpr const char* kDqNarrowStaging = "DQ_NARROW_STAGING";
inline constexpr const char* kDqStagingAtUse = "DQ_STAGING_AT_USE";
inline constexpr const char* kTiles = "TILES";
inline constexpr const char* kKvMajor = "KV_MAJOR";

// GEMM (kernels/gemm.hpp)
inline constexpr const char* kOutDtype = "OUT_DTYPE";
inline constexpr const char* kAKmajor = "A_KMAJOR";
inline constexpr const char* kBKmajor = "B_KMAJOR";
inline constexpr const char* kGroupM = "GROUP_M";
inline constexpr const char* kDropoutMask = "DROPOUT_MASK";
inline constexpr const char* kMaskCausal = "MASK_CAUSAL";
inline constexpr const char* kMaskBlockM = "MASK_BLOCK_M";
inline constexpr const char* kMaskBlockW = "MASK_BLOCK_W";
inline constexpr const char* kMaskAlign = "MASK_ALIGN";
inline constexpr const char* kMaskTilesPerStep = "MASK_TILES_PER_STEP";
inline constexpr const char* kMaskWarps = "MASK_WARPS";
inline constexpr const char* kMaskRange = "MASK_RANGE";
inline constexpr const char* kMaskRegisters = "MASK_REGISTERS";

// the packed dropout-mask kernel (kernels/dropout_mask.hpp)
inline constexpr const char* kBlockW = "BLOCK_W";

// context parallelism's merge / accumulate kernels (kernels/context_parallel.hpp)
inline constexpr const char* kFirst = "FIRST";  // the first partial: acc = part, the accumulator not read

}  // namespace tilejit::kernels::meta_name
