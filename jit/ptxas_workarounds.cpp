#include "jit/ptxas_workarounds.hpp"

#include <fmt/format.h>

#include <regex>
#include <string_view>

namespace tilejit::jit {
namespace {

// One negation on one line: an optional guard, then neg.sN d, x / sub.{s,u}N d, 0, x /
// mul.lo.{s,u}N d, x, -1 (either operand order). Captures: indent, guard, width, d, x.
const std::regex& negation_pattern() {
  static const std::regex re(
      R"(^(\s*)(@!?%\w+\s+)?(?:neg\.s(16|32)\s+(%\w+),\s*(%\w+)|)"
      R"(sub\.[su](16|32)\s+(%\w+),\s*0,\s*(%\w+)|)"
      R"(mul\.lo\.[su](16|32)\s+(%\w+),\s*(?:(%\w+),\s*-1|-1,\s*(%\w+)))\s*;\s*$)");
  return re;
}

}  // namespace

int rewrite_integer_negations(std::string& ptx) {
  std::string out;
  out.reserve(ptx.size() + 256);
  int rewritten = 0;
  std::smatch m;
  size_t pos = 0;
  while (pos < ptx.size()) {
    size_t end = ptx.find('\n', pos);
    size_t next = end == std::string::npos ? ptx.size() : end + 1;
    std::string_view view(ptx.data() + pos, (end == std::string::npos ? ptx.size() : end) - pos);
    // (std::regex is slow: only lines that can be a negation meet it)
    bool candidate = view.find("neg.s") != view.npos || (view.find("sub.") != view.npos && view.find(", 0,") != view.npos) ||
                     (view.find("mul.lo.") != view.npos && view.find("-1") != view.npos);
    std::string line(view);
    if (candidate && std::regex_match(line, m, negation_pattern())) {
      auto group = [&](int a, int b, int c) { return m[a].matched ? m[a].str() : m[b].matched ? m[b].str() : m[c].str(); };
      std::string width = group(3, 6, 9), dst = group(4, 7, 10);
      std::string src = m[5].matched ? m[5].str() : m[8].matched ? m[8].str() : m[11].matched ? m[11].str() : m[12].str();
      std::string guard = m[2].str();
      out += fmt::format("{ind}{{ .reg .b{w} %tj_not; {g}not.b{w} %tj_not, {x}; {g}add.s{w} {d}, %tj_not, 1; }}{nl}", fmt::arg("ind", m[1].str()),
                         fmt::arg("nl", end == std::string::npos ? "" : "\n"),
                         fmt::arg("w", width), fmt::arg("g", guard), fmt::arg("x", src), fmt::arg("d", dst));
      ++rewritten;
    } else {
      out.append(ptx, pos, next - pos);
    }
    pos = next;
  }
  if (rewritten) ptx = std::move(out);
  return rewritten;
}

}  // namespace tilejit::jit
