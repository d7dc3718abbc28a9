// attention_bench --check DIR: bench/attention.py's cross-check cases through the API.
#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "api/attention.hpp"
#include "kernels/attention/mask.hpp"
#include "jit/compile.hpp"
#include "runtime/device_buffer.hpp"
#include "bench/attention_ab.hpp"
#include "bench/attention_modes.hpp"

namespace tilejit::attention_bench {

namespace {

// ---------------------------------------------------------------------------------------------
// --check DIR: cases.txt has one case per line, "key=value" fields:
//   name dtype(bf16|f16) B Hq Hkv Sq Sk D causal(0|1) scale layout(bshd|bhsd) [varlen=1 nseq total_q total_k max_q max_k]
//   [dropout_p seed offset: dropout; DIR/<name>.mask.bin then receives the forward's keep-mask, u8
//   [B * Hq, Sq, Sk] (varlen [nseq * Hq, max_q, max_k]; entries the forward does not visit: 0xFF)]
// Inputs DIR/<name>.{q,k,v,do}.bin (raw, contiguous in the layout; varlen: packed [total, H, D]),
// DIR/<name>.{cu_q,cu_k}.bin (i32, varlen). Outputs DIR/<name>.{o,dq,dk,dv}.bin in the inputs'
// layout and DIR/<name>.lse.bin (f32 [B, Hq, Sq]; varlen [Hq, total_q]).

std::vector<char> read_file(const std::string& path, size_t bytes) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  std::vector<char> data(bytes);
  f.read(data.data(), static_cast<std::streamsize>(bytes));
  if (static_cast<size_t>(f.gcount()) != bytes)
    throw std::runtime_error(fmt::format("{}: expected {} bytes, read {}", path, bytes, f.gcount()));
  return data;
}

void write_file(const std::string& path, const DeviceBuffer& buf, size_t bytes) {
  std::vector<char> data(bytes);
  buf.download(data.data(), bytes);
  std::ofstream f(path, std::ios::binary);
  f.write(data.data(), static_cast<std::streamsize>(bytes));
  if (!f) throw std::runtime_error("cannot write " + path);
}

DeviceBuffer upload_file(const std::string& path, size_t bytes) {
  DeviceBuffer b(bytes);
  const auto data = read_file(path, bytes);
  b.upload(data.data(), bytes);
  return b;
}

DeviceBuffer poisoned(size_t bytes) {
  DeviceBuffer b(bytes);
  b.fill_bytes(0xFF);
  return b;
}

}  // namespace

int check(const std::string& dir) {
  std::ifstream list(dir + "/cases.txt");
  if (!list) {
    std::fprintf(stderr, "cannot open %s/cases.txt\n", dir.c_str());
    return 2;
  }
  int failures = 0;
  for (std::string line; std::getline(list, line);) {
    if (line.empty()) continue;
    std::map<std::string, std::string> kv;
    std::istringstream in(line);
    for (std::string field; in >> field;) {
      const auto eq = field.find('=');
      if (eq != std::string::npos) kv[field.substr(0, eq)] = field.substr(eq + 1);
    }
    const std::string name = kv["name"];
    try {
      auto num = [&](const char* key) {
        if (!kv.contains(key)) throw std::runtime_error(fmt::format("case '{}' has no {}", name, key));
        return std::stoll(kv[key]);
      };
      const ir::DType dt = kv["dtype"] == "f16" ? ir::DType::f16 : ir::DType::bf16;
      const int64_t Hq = num("Hq"), Hkv = num("Hkv"), D = num("D"), es = ir::byte_size(dt);
      const bool varlen = kv["varlen"] == "1", bhsd = kv["layout"] == "bhsd";
      attention::Options opts;
      opts.causal = num("causal") != 0;
      if (kv.contains("scale")) opts.softmax_scale = std::stof(kv["scale"]);
      if (kv.contains("dropout_p")) {
        opts.dropout_p = std::stod(kv["dropout_p"]);
        opts.seed = std::stoull(kv["seed"]);
        opts.offset = std::stoull(kv["offset"]);
      }
      const std::string base = dir + "/" + name;
      int64_t nq = 0, nk = 0, nlse = 0;  // elements of q, k, lse
      int64_t B = 0, Sq = 0, Sk = 0, total_q = 0, total_k = 0, nseq = 0;
      if (varlen) {
        nseq = num("nseq"), total_q = num("total_q"), total_k = num("total_k");
        nq = total_q * Hq * D, nk = total_k * Hkv * D, nlse = Hq * total_q;
      } else {
        B = num("B"), Sq = num("Sq"), Sk = num("Sk");
        nq = B * Sq * Hq * D, nk = B * Sk * Hkv * D, nlse = B * Hq * Sq;
      }
      const auto qb = static_cast<size_t>(nq * es), kb = static_cast<size_t>(nk * es), lb = static_cast<size_t>(nlse * 4);
      DeviceBuffer q = upload_file(base + ".q.bin", qb), k = upload_file(base + ".k.bin", kb), v = upload_file(base + ".v.bin", kb),
                   dout = upload_file(base + ".do.bin", qb);
      DeviceBuffer o = poisoned(qb), dq = poisoned(qb), dk = poisoned(kb), dv = poisoned(kb), lse = poisoned(lb);
      DeviceBuffer cuq, cuk;
      // Logical [B, S, H, D] views; [B, H, S, D] files are passed as permuted views.
      auto view = [&](const DeviceBuffer& b, int64_t S, int64_t H) {
        if (varlen) return attention::contiguous(b.ptr(), dt, {S, H, D});
        if (bhsd) return attention::permute(attention::contiguous(b.ptr(), dt, {B, H, S, D}), {0, 2, 1, 3});
        return attention::contiguous(b.ptr(), dt, {B, S, H, D});
      };
      const int64_t sq = varlen ? total_q : Sq, sk = varlen ? total_k : Sk;
      const auto L = varlen ? attention::contiguous(lse.ptr(), ir::DType::f32, {Hq, total_q})
                            : attention::contiguous(lse.ptr(), ir::DType::f32, {B, Hq, Sq});
      if (varlen) {
        const auto cb = static_cast<size_t>((nseq + 1) * 4);
        cuq = upload_file(base + ".cu_q.bin", cb);
        cuk = upload_file(base + ".cu_k.bin", cb);
        opts.cu_seqlens_q = attention::contiguous(cuq.ptr(), ir::DType::i32, {nseq + 1});
        opts.cu_seqlens_k = attention::contiguous(cuk.ptr(), ir::DType::i32, {nseq + 1});
        opts.max_seqlen_q = num("max_q");
        opts.max_seqlen_k = num("max_k");
      }
      const auto Q = view(q, sq, Hq), K = view(k, sk, Hkv), V = view(v, sk, Hkv), O = view(o, sq, Hq);
      DeviceBuffer mask;
      size_t mask_bytes = 0;
      if (opts.dropout_p > 0) {
        const int64_t mb = (varlen ? nseq : B) * Hq, mq = varlen ? num("max_q") : Sq, mk = varlen ? num("max_k") : Sk;
        mask_bytes = static_cast<size_t>(mb * mq * mk);
        mask = poisoned(mask_bytes);
        opts.dropout_mask = attention::contiguous(mask.ptr(), ir::DType::u8, {mb, mq, mk});
      }
      attention::forward(Q, K, V, O, L, opts);
      opts.dropout_mask.reset();
      if (mask_bytes) write_file(base + ".mask.bin", mask, mask_bytes);
      const bool bwd = attention::backward_available() && (!varlen || attention::varlen_supported(true));
      if (bwd) attention::backward(Q, K, V, O, view(dout, sq, Hq), L, view(dq, sq, Hq), view(dk, sk, Hkv), view(dv, sk, Hkv), opts);
      write_file(base + ".o.bin", o, qb);
      write_file(base + ".lse.bin", lse, lb);
      if (bwd) {
        write_file(base + ".dq.bin", dq, qb);
        write_file(base + ".dk.bin", dk, kb);
        write_file(base + ".dv.bin", dv, kb);
      }
      std::printf("ran %s%s\n", name.c_str(), bwd ? "" : " (forward only)");
    } catch (const std::exception& e) {
      ++failures;
      std::printf("FAILED %s: %s\n", name.c_str(), e.what());
    }
    std::fflush(stdout);
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace tilejit::attention_bench
