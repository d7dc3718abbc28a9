// PTX -> cubin (nvJitLink and ptxas), the ptxas -v parser on real logs, and nvrtc -> PTX.
// Needs no GPU; a tool missing from this machine is skipped with a visible MESSAGE.
#include <doctest/doctest.h>

#include <stdlib.h>  // mkdtemp, setenv

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "jit/nvrtc.hpp"
#include "jit/ptx_compiler.hpp"

using namespace tilejit::jit;

namespace {

// c[i] = a[i] + b[i] for i < n, hand-written for sm_90a.
const std::string kVaddPtx = R"(//
// vadd: c[i] = a[i] + b[i]
//
.version 8.0
.target sm_90a
.address_size 64

.visible .entry vadd(
	.param .u64 vadd_param_0,
	.param .u64 vadd_param_1,
	.param .u64 vadd_param_2,
	.param .u32 vadd_param_3
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<6>;
	.reg .f32 	%f<4>;
	.reg .b64 	%rd<11>;

	ld.param.u64 	%rd1, [vadd_param_0];
	ld.param.u64 	%rd2, [vadd_param_1];
	ld.param.u64 	%rd3, [vadd_param_2];
	ld.param.u32 	%r2, [vadd_param_3];
	mov.u32 	%r3, %ctaid.x;
	mov.u32 	%r4, %ntid.x;
	mov.u32 	%r5, %tid.x;
	mad.lo.s32 	%r1, %r3, %r4, %r5;
	setp.ge.s32 	%p1, %r1, %r2;
	@%p1 bra 	$L__BB0_2;
	cvta.to.global.u64 	%rd4, %rd1;
	mul.wide.s32 	%rd5, %r1, 4;
	add.s64 	%rd6, %rd4, %rd5;
	cvta.to.global.u64 	%rd7, %rd2;
	add.s64 	%rd8, %rd7, %rd5;
	ld.global.f32 	%f1, [%rd8];
	ld.global.f32 	%f2, [%rd6];
	add.f32 	%f3, %f2, %f1;
	cvta.to.global.u64 	%rd9, %rd3;
	add.s64 	%rd10, %rd9, %rd5;
	st.global.f32 	[%rd10], %f3;
$L__BB0_2:
	ret;
}
)";

// Two entries; the second declares 512 B of static shared memory (kernels are listed in this order).
const std::string kTwoKernelsPtx = kVaddPtx + R"(
.visible .entry smem_rotate(.param .u64 smem_rotate_param_0)
{
	.shared .align 4 .b8 buf[512];
	.reg .b32 %r<4>;
	.reg .b64 %rd<3>;
	ld.param.u64 %rd1, [smem_rotate_param_0];
	mov.u32 %r1, %tid.x;
	shl.b32 %r2, %r1, 2;
	mov.u32 %r3, buf;
	add.u32 %r3, %r3, %r2;
	st.shared.u32 [%r3], %r1;
	bar.sync 0;
	ld.shared.u32 %r2, [%r3+4];
	cvta.to.global.u64 %rd2, %rd1;
	st.global.u32 [%rd2], %r2;
	ret;
}
)";

// 64 loaded values all live across a reduction, under .maxnreg 32: ptxas must spill.
std::string spill_ptx() {
  std::string body;
  for (int k = 0; k < 64; ++k) body += fmt::format("\tld.global.f32 %f{}, [%rd1+{}];\n", k, k * 512);
  body += "\tmov.f32 %f64, 0f00000000;\n";
  for (int k = 0; k < 64; ++k) body += fmt::format("\tfma.rn.f32 %f64, %f{}, %f{}, %f64;\n", k, 63 - k);
  for (int k = 0; k < 64; ++k) body += fmt::format("\tmul.f32 %f{0}, %f{0}, %f64;\n\tst.global.f32 [%rd2+{1}], %f{0};\n", k, k * 512);
  return R"(.version 8.0
.target sm_90a
.address_size 64

.visible .entry spill_heavy(.param .u64 spill_heavy_in, .param .u64 spill_heavy_out) .maxnreg 32
{
	.reg .f32 %f<65>;
	.reg .b32 %r<2>;
	.reg .b64 %rd<5>;
	ld.param.u64 %rd3, [spill_heavy_in];
	ld.param.u64 %rd4, [spill_heavy_out];
	cvta.to.global.u64 %rd3, %rd3;
	cvta.to.global.u64 %rd4, %rd4;
	mov.u32 %r1, %tid.x;
	mul.wide.u32 %rd1, %r1, 4;
	add.s64 %rd2, %rd4, %rd1;
	add.s64 %rd1, %rd3, %rd1;
)" + body + "\tret;\n}\n";
}

bool is_elf(const std::vector<uint8_t>& b) {
  return b.size() > 4 && b[0] == 0x7F && b[1] == 'E' && b[2] == 'L' && b[3] == 'F';
}

// Whether `tool` can run here; if not, say so visibly (the caller then skips).
bool tool_present(PtxTool tool) {
  if (tool == PtxTool::NvJitLink) {
    std::string why;
    if (nvjitlink_available(&why)) return true;
    MESSAGE("skipping nvJitLink checks: " << why);
    return false;
  }
  if (!find_ptxas().empty()) return true;
  MESSAGE("skipping ptxas checks: no ptxas on TILEJIT_PTXAS, PATH or the CUDA root");
  return false;
}

bool nvrtc_present() {
  std::string why;
  if (nvrtc_available(&why)) return true;
  MESSAGE("skipping nvrtc checks: " << why);
  return false;
}

// Sets an environment variable for one scope and restores the old value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Real logs, captured on this machine (CUDA 13.0) from one module: an entry with a 64-float local
// array under __maxnreg__(16) (spilly), an entry calling a __noinline__ device function with a
// local array (with_func -> _Z6helperPKfi), and an entry with 1 KB of static shared memory and a
// __syncthreads (smem_kernel).

// `ptxas -arch=sm_90a -v` (13.0.88), whole-program mode.
const char* const kPtxasLog = R"(ptxas warning : For entry spilly adjusting per thread register count of 16 to lower bound of 24
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'spilly' for 'sm_90a'
ptxas info    : Function properties for spilly
    512 bytes stack frame, 608 bytes spill stores, 780 bytes spill loads
ptxas info    : Used 24 registers, used 0 barriers, 512 bytes cumulative stack size
ptxas info    : Compile time = 23.789 ms
ptxas info    : Compiling entry function 'with_func' for 'sm_90a'
ptxas info    : Function properties for with_func
    256 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 256 bytes cumulative stack size
ptxas info    : Compile time = 10.452 ms
ptxas info    : Function properties for _Z6helperPKfi
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'smem_kernel' for 'sm_90a'
ptxas info    : Function properties for smem_kernel
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 1 barriers, 1024 bytes smem
ptxas info    : Compile time = 1.368 ms
)";

// nvJitLink 13.0 info log with -verbose for the same PTX: ptxas's lines (compiled as relocatable
// code, so the device function keeps its own frame), then the link summary.
const char* const kNvJitLinkLog = R"(ptxas warning : For entry spilly adjusting per thread register count of 16 to lower bound of 24
ptxas info    : 0 bytes gmem
ptxas info    : Function properties for _Z6helperPKfi
ptxas         .     264 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compile time = 6.447 ms
ptxas info    : Compiling entry function 'spilly' for 'sm_90a'
ptxas info    : Function properties for spilly
ptxas         .     512 bytes stack frame, 608 bytes spill stores, 780 bytes spill loads
ptxas info    : Used 24 registers, used 0 barriers
ptxas info    : Compile time = 16.982 ms
ptxas info    : Compiling entry function 'with_func' for 'sm_90a'
ptxas info    : Function properties for with_func
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 24 registers, used 0 barriers
ptxas info    : Compile time = 1.447 ms
ptxas info    : Compiling entry function 'smem_kernel' for 'sm_90a'
ptxas info    : Function properties for smem_kernel
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 1 barriers, 1024 bytes smem
ptxas info    : Compile time = 1.459 ms
info    : 0 bytes gmem
info    : Function properties for 'smem_kernel':
info    : used 10 registers, used 1 barriers, 0 stack, 2048 bytes smem, 544 bytes cmem[0], 0 bytes lmem
info    : Function properties for 'with_func':
info    : used 24 registers, used 0 barriers, 264 stack, 0 bytes smem, 548 bytes cmem[0], 0 bytes lmem
info    : Function properties for 'spilly':
info    : used 24 registers, used 0 barriers, 512 stack, 0 bytes smem, 544 bytes cmem[0], 0 bytes lmem
)";

const KernelInfo* find(const std::vector<KernelInfo>& ks, const std::string& name) {
  for (const auto& k : ks)
    if (k.name == name) return &k;
  return nullptr;
}

}  // namespace

TEST_CASE("parse_kernel_info: real ptxas 13.0 -v log") {
  auto ks = parse_kernel_info(kPtxasLog, "sm_90a");
  REQUIRE(ks.size() == 3);  // the device function is not a kernel
  CHECK(ks[0].name == "spilly");
  CHECK(ks[1].name == "with_func");
  CHECK(ks[2].name == "smem_kernel");
  CHECK(ks[0].arch == "sm_90a");
  CHECK(ks[0].registers == 24);
  CHECK(ks[0].spill_store_bytes == 608);
  CHECK(ks[0].spill_load_bytes == 780);
  CHECK(ks[0].stack_frame_bytes == 512);
  CHECK(ks[1].registers == 32);
  CHECK(ks[1].stack_frame_bytes == 256);
  CHECK(ks[1].spill_store_bytes == 0);
  CHECK(ks[2].registers == 12);
  CHECK(ks[2].shared_bytes == 1024);
  CHECK(ks[2].stack_frame_bytes == 0);
  CHECK(ks[2].constant_bytes == 0);  // ptxas 13 prints no cmem
}

TEST_CASE("parse_kernel_info: real nvJitLink 13.0 -verbose log") {
  auto ks = parse_kernel_info(kNvJitLinkLog, "sm_90a");
  REQUIRE(ks.size() == 3);
  const KernelInfo* spilly = find(ks, "spilly");
  const KernelInfo* with_func = find(ks, "with_func");
  const KernelInfo* smem = find(ks, "smem_kernel");
  REQUIRE(spilly);
  REQUIRE(with_func);
  REQUIRE(smem);
  CHECK(find(ks, "_Z6helperPKfi") == nullptr);
  CHECK(spilly->registers == 24);
  CHECK(spilly->spill_store_bytes == 608);
  CHECK(spilly->spill_load_bytes == 780);
  CHECK(spilly->stack_frame_bytes == 512);
  // The entry's own frame is 0, but the link summary counts the callee's 264 bytes.
  CHECK(with_func->stack_frame_bytes == 264);
  // Static shared memory as ptxas reports it, not the link summary's figure with the 1 KB reserve.
  CHECK(smem->shared_bytes == 1024);
  CHECK(smem->registers == 10);
  CHECK(smem->constant_bytes == 544);
  CHECK(smem->to_string() == "smem_kernel sm_90a: 10 registers, 1024 B shared, 0 B spill stores, 0 B spill loads, 0 B stack");
}

TEST_CASE("parse_kernel_info: older ptxas formats (cmem banks, cumulative stack, nvlink summary)") {
  // The shapes CUDA 11/12 print: cmem banks and textures on the "Used" line, no barrier count or
  // "used N barriers", build-tool prefixes, CRLF line ends.
  const char* log =
      "1>  ptxas info    : 4 bytes gmem, 64 bytes cmem[3]\r\n"
      "1>  ptxas info    : Compiling entry function '_Z4stepPfi' for 'sm_80'\r\n"
      "1>  ptxas info    : Function properties for _Z4stepPfi\r\n"
      "1>      40 bytes stack frame, 12 bytes spill stores, 16 bytes spill loads\r\n"
      "1>  ptxas info    : Used 255 registers, 96 bytes cumulative stack size, 4096 bytes smem, 360 bytes cmem[0], 8 bytes cmem[2], 1 textures\r\n"
      "ptxas info    : Compiling entry function 'plain' for 'sm_86'\n"
      "ptxas info    : Function properties for plain\n"
      "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 8 registers, used 0 barriers, 380 bytes cmem[0]\n"
      "nvlink info    : Function properties for 'linked_only':\n"
      "nvlink info    : used 40 registers, 16 stack, 2048 bytes smem, 352 bytes cmem[0], 4 bytes cmem[2], 0 bytes lmem\n";
  auto ks = parse_kernel_info(log, "sm_90a");
  REQUIRE(ks.size() == 3);
  CHECK(ks[0].name == "_Z4stepPfi");
  CHECK(ks[0].arch == "sm_80");
  CHECK(ks[0].registers == 255);
  CHECK(ks[0].shared_bytes == 4096);
  CHECK(ks[0].constant_bytes == 368);
  CHECK(ks[0].stack_frame_bytes == 96);
  CHECK(ks[0].spill_store_bytes == 12);
  CHECK(ks[0].spill_load_bytes == 16);
  CHECK(ks[1].name == "plain");
  CHECK(ks[1].arch == "sm_86");
  CHECK(ks[1].registers == 8);
  CHECK(ks[1].constant_bytes == 380);
  CHECK(ks[2].name == "linked_only");
  CHECK(ks[2].arch == "sm_90a");  // not in the log: the requested arch
  CHECK(ks[2].registers == 40);
  CHECK(ks[2].shared_bytes == 2048);  // only the link summary describes it
  CHECK(ks[2].stack_frame_bytes == 16);
  CHECK(ks[2].constant_bytes == 356);
  CHECK(parse_kernel_info("", "sm_90a").empty());
  CHECK(parse_kernel_info("ptxas fatal   : Unresolved extern function 'foo'\n", "sm_90a").empty());
}

TEST_CASE("ptx_to_cubin: a small kernel through each tool") {
  for (PtxTool tool : {PtxTool::NvJitLink, PtxTool::Ptxas}) {
    CAPTURE(to_string(tool));
    if (!tool_present(tool)) continue;
    CubinResult r = ptx_to_cubin(kVaddPtx, "sm_90a", "vadd", tool);
    CHECK(is_elf(r.cubin));
    CHECK(r.tool.rfind(tool == PtxTool::NvJitLink ? "nvJitLink " : "ptxas ", 0) == 0);
    REQUIRE(r.kernels.size() == 1);
    const KernelInfo& k = r.kernels[0];
    CHECK(k.name == "vadd");
    CHECK(k.arch == "sm_90a");
    CHECK(k.registers > 0);
    CHECK(k.spill_store_bytes == 0);
    CHECK(k.spill_load_bytes == 0);
    CHECK(k.stack_frame_bytes == 0);
    CHECK(k.shared_bytes == 0);
    CHECK(r.milliseconds > 0);
    // A second call shows the steady-state cost (the first also loads the library / asks ptxas its version).
    CubinResult again = ptx_to_cubin(kVaddPtx, "sm_90a", "vadd", tool);
    MESSAGE(r.tool << ": " << k.to_string() << "; " << fmt::format("{:.1f} ms first, {:.1f} ms second", r.milliseconds, again.milliseconds));
  }
}

TEST_CASE("ptx_to_cubin: Auto prefers nvJitLink, and versions are reported") {
  std::string versions = ptx_tool_versions();
  MESSAGE("tool versions: " << versions);
  CHECK(versions.find("nvJitLink ") != std::string::npos);
  CHECK(versions.find("; ptxas ") != std::string::npos);
  if (nvjitlink_available()) CHECK(versions.find("nvJitLink none") == std::string::npos);
  if (!nvjitlink_available() && find_ptxas().empty()) {
    CHECK_THROWS_AS(ptx_to_cubin(kVaddPtx, "sm_90a", "vadd"), CompileError);
    return;
  }
  CubinResult r = ptx_to_cubin(kVaddPtx, "sm_90a", "vadd");
  CHECK(is_elf(r.cubin));
  CHECK(r.tool.rfind(nvjitlink_available() ? "nvJitLink" : "ptxas", 0) == 0);
}

TEST_CASE("TILEJIT_PTX_TOOL picks the tool that Auto means; other values are errors naming it") {
  {
    ScopedEnv unset("TILEJIT_PTX_TOOL", "");
    ::unsetenv("TILEJIT_PTX_TOOL");
    CHECK(resolve_ptx_tool(PtxTool::Auto) == PtxTool::Auto);  // ptx_to_cubin's own choice
    CHECK(resolve_ptx_tool(PtxTool::Ptxas) == PtxTool::Ptxas);
  }
  {
    ScopedEnv env("TILEJIT_PTX_TOOL", "ptxas");
    CHECK(resolve_ptx_tool(PtxTool::Auto) == PtxTool::Ptxas);
    CHECK(resolve_ptx_tool(PtxTool::NvJitLink) == PtxTool::NvJitLink);  // an explicit tool wins
    if (!find_ptxas().empty()) {
      // whole-program ptxas, not nvJitLink's relocatable compile (their SASS differs)
      CubinResult r = ptx_to_cubin(kVaddPtx, "sm_90a", "vadd");
      CHECK(r.tool.rfind("ptxas ", 0) == 0);
    }
  }
  {
    ScopedEnv env("TILEJIT_PTX_TOOL", "NvJitLink");  // case does not matter
    CHECK(resolve_ptx_tool(PtxTool::Auto) == PtxTool::NvJitLink);
  }
  {
    ScopedEnv env("TILEJIT_PTX_TOOL", "nvcc");
    try {
      resolve_ptx_tool(PtxTool::Auto);
      FAIL("no error for TILEJIT_PTX_TOOL=nvcc");
    } catch (const CompileError& e) {
      const std::string what = e.what();
      CHECK(what.find("TILEJIT_PTX_TOOL='nvcc'") != std::string::npos);
      CHECK(what.find("ptxas, nvjitlink") != std::string::npos);
    }
    CHECK_THROWS_AS(ptx_to_cubin(kVaddPtx, "sm_90a", "vadd"), CompileError);
  }
}

TEST_CASE("ptx_to_cubin: kernels in declaration order, with static shared memory") {
  for (PtxTool tool : {PtxTool::NvJitLink, PtxTool::Ptxas}) {
    CAPTURE(to_string(tool));
    if (!tool_present(tool)) continue;
    CubinResult r = ptx_to_cubin(kTwoKernelsPtx, "sm_90a", "two_kernels", tool);
    REQUIRE(r.kernels.size() == 2);
    CHECK(r.kernels[0].name == "vadd");
    CHECK(r.kernels[1].name == "smem_rotate");
    CHECK(r.kernels[0].shared_bytes == 0);
    CHECK(r.kernels[1].shared_bytes == 512);
    CHECK(r.kernels[1].registers > 0);
  }
}

TEST_CASE("ptx_to_cubin: spills are reported") {
  const std::string ptx = spill_ptx();
  for (PtxTool tool : {PtxTool::NvJitLink, PtxTool::Ptxas}) {
    CAPTURE(to_string(tool));
    if (!tool_present(tool)) continue;
    CubinResult r = ptx_to_cubin(ptx, "sm_90a", "spill_heavy", tool);
    REQUIRE(r.kernels.size() == 1);
    const KernelInfo& k = r.kernels[0];
    MESSAGE(r.tool << ": " << k.to_string());
    CHECK(k.name == "spill_heavy");
    CHECK(k.registers <= 32);
    CHECK(k.spill_store_bytes > 0);
    CHECK(k.spill_load_bytes > 0);
    CHECK(k.stack_frame_bytes > 0);
  }
}

TEST_CASE("ptx_to_cubin: broken PTX gives a CompileError with the kernel name and the tool's log") {
  std::string bad = kVaddPtx;
  const std::string good_line = "add.f32 \t%f3, %f2, %f1;";
  size_t at = bad.find(good_line);
  REQUIRE(at != std::string::npos);
  bad.replace(at, good_line.size(), "add.f32 \t%f3, %f2, %f_undefined;");
  const int line = 1 + int(std::count(bad.begin(), bad.begin() + std::ptrdiff_t(at), '\n'));
  for (PtxTool tool : {PtxTool::NvJitLink, PtxTool::Ptxas}) {
    CAPTURE(to_string(tool));
    if (!tool_present(tool)) continue;
    try {
      ptx_to_cubin(bad, "sm_90a", "vadd_broken", tool);
      FAIL("broken PTX compiled");
    } catch (const CompileError& e) {
      const std::string msg = e.what();
      CAPTURE(msg);
      CHECK(msg.find("'vadd_broken'") != std::string::npos);
      CHECK(msg.find(fmt::format("line {}", line)) != std::string::npos);
      CHECK(msg.find("%f_undefined") != std::string::npos);
    }
  }
}

TEST_CASE("ptx_to_cubin: bad arguments and a missing tool are CompileErrors naming the kernel") {
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const CompileError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  std::string m = message([] { ptx_to_cubin(kVaddPtx, "hopper", "vadd"); });
  CHECK(m.find("'vadd'") != std::string::npos);
  CHECK(m.find("'hopper'") != std::string::npos);
  CHECK(m.find("sm_90a") != std::string::npos);
  m = message([] { ptx_to_cubin("  \n", "sm_90a", "empty_kernel"); });
  CHECK(m.find("'empty_kernel'") != std::string::npos);
  {
    ScopedEnv env("TILEJIT_PTXAS", "/nonexistent/ptxas");
    m = message([] { ptx_to_cubin(kVaddPtx, "sm_90a", "vadd", PtxTool::Ptxas); });
    CHECK(m.find("'vadd'") != std::string::npos);
    CHECK(m.find("TILEJIT_PTXAS=/nonexistent/ptxas") != std::string::npos);
    CHECK(ptx_tool_versions().find("ptxas none") != std::string::npos);
  }
  if (tool_present(PtxTool::Ptxas)) {
    // An explicit TILEJIT_PTXAS is used as given.
    ScopedEnv env("TILEJIT_PTXAS", find_ptxas());
    CHECK(is_elf(ptx_to_cubin(kVaddPtx, "sm_90a", "vadd", PtxTool::Ptxas).cubin));
  }
}

TEST_CASE("ptx_to_cubin: ptxas leaves no temporary files, on success or failure") {
  if (!tool_present(PtxTool::Ptxas)) return;
  namespace fs = std::filesystem;
  std::string templ = (fs::temp_directory_path() / "tilejit-test-XXXXXX").string();
  REQUIRE(::mkdtemp(templ.data()));
  {
    ScopedEnv env("TMPDIR", templ);
    CHECK(is_elf(ptx_to_cubin(kVaddPtx, "sm_90a", "vadd", PtxTool::Ptxas).cubin));
    CHECK_THROWS_AS(ptx_to_cubin(".version 8.0\n.target sm_90a\nnonsense\n", "sm_90a", "junk", PtxTool::Ptxas),
                    CompileError);
  }
  CHECK(fs::is_empty(templ));
  fs::remove_all(templ);
}

TEST_CASE("ptx_to_cubin: concurrent compiles (the autotuner compiles in parallel)") {
  std::vector<PtxTool> tools;
  for (PtxTool t : {PtxTool::NvJitLink, PtxTool::Ptxas})
    if (tool_present(t)) tools.push_back(t);
  if (tools.empty()) return;
  const std::string spill = spill_ptx();
  std::vector<std::thread> threads;
  std::vector<int> ok(8, 0);
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      try {
        CubinResult r = ptx_to_cubin(i % 2 ? spill : kVaddPtx, "sm_90a", "concurrent", tools[size_t(i / 2) % tools.size()]);
        ok[size_t(i)] = is_elf(r.cubin) && r.kernels.size() == 1 && (i % 2 == 0 || r.kernels[0].spill_store_bytes > 0);
      } catch (...) {
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 8; ++i) CHECK(ok[size_t(i)] == 1);
}

TEST_CASE("nvrtc: CUDA C++ -> PTX -> cubin") {
  if (!nvrtc_present()) return;
  MESSAGE(nvrtc_version());
  CHECK(nvrtc_version().rfind("nvrtc 13", 0) == 0);
  const std::string src = R"(
#include <cuda/std/cstdint>
extern "C" __global__ void scale(float* p, float s, cuda::std::int32_t n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = p[i] / s + sqrtf(p[0]);
}
__global__ void mangled_kernel(float* p) { p[threadIdx.x] = 2.0f; }
)";
  NvrtcResult r = nvrtc_compile(src, "scale_program", "sm_90a");
  MESSAGE(fmt::format("nvrtc: {:.1f} ms", r.milliseconds));
  CHECK(r.milliseconds > 0);
  CHECK(r.ptx.find(".entry scale(") != std::string::npos);
  CHECK(r.ptx.find(".entry _Z14mangled_kernelPf(") != std::string::npos);
  CHECK(r.ptx.find(".target sm_90a") != std::string::npos);
  CHECK(r.ptx.back() != '\0');
  // No fast math by default: the division stays IEEE round-to-nearest.
  CHECK(r.ptx.find("div.rn.f32") != std::string::npos);
  CHECK(r.ptx.find("sqrt.rn.f32") != std::string::npos);

  if (!nvjitlink_available() && find_ptxas().empty()) return;
  CubinResult c = ptx_to_cubin(r.ptx, "sm_90a", "scale_program");
  CHECK(is_elf(c.cubin));
  REQUIRE(c.kernels.size() == 2);
  CHECK(c.kernels[0].name == "scale");
  CHECK(c.kernels[1].name == "_Z14mangled_kernelPf");
  CHECK(c.kernels[0].registers > 0);
}

TEST_CASE("nvrtc: a syntax error is a CompileError with the program name and nvrtc's log") {
  if (!nvrtc_present()) return;
  const std::string src = "extern \"C\" __global__ void broken(float* p) {\n  p[0] = 1.0f\n}\n";
  try {
    nvrtc_compile(src, "broken_program", "sm_90a");
    FAIL("a syntax error compiled");
  } catch (const CompileError& e) {
    const std::string msg = e.what();
    CAPTURE(msg);
    CHECK(msg.find("'broken_program'") != std::string::npos);
    CHECK(msg.find("broken_program.cu(3): error") != std::string::npos);  // nvrtc's log, with the line
    CHECK(msg.find("expected a \";\"") != std::string::npos);
  }
  CHECK_THROWS_AS(nvrtc_compile("__global__ void k() {}", "bad_arch", "gfx90a"), CompileError);
}
