// kvc_plan: prints the KV-cache footprint tables of the planner's worked examples
// (docs/planner.md), or of one of them at another context, batch or budget.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "kvc/core/error.h"
#include "kvc/planner/planner.h"

namespace {

using kvc::planner::BlockSelectParams;
using kvc::planner::Dsv4Options;
using kvc::planner::EntryFormat;
using kvc::planner::ModelSpec;

const char* const kUsage =
    "usage: kvc_plan [--model all|llama|smollm|dsv4] [--context N] [--batch N]\n"
    "                [--budget-gib X] [--bytes] [--stores] [--help]\n"
    "\n"
    "Prints the KV-cache footprint of the planner's worked examples, by layer kind and by\n"
    "component, before anything is allocated (see docs/planner.md):\n"
    "  llama   Llama-3.1-8B at 128K: dense, block_select fp16k_q4v and q8 (W 1024, B 32, mean K)\n"
    "  smollm  SmolLM2-135M at 8K: the same three\n"
    "  dsv4    DeepSeek-V4-Flash at 1M (1048576): bf16 and FP8 (584 B) main entries with mxfp4\n"
    "          indexer keys, fp8 indexer keys, and the audit's bf16 8192-wide indexer mistake;\n"
    "          DeepSeek-V4-Pro at 1M with bf16 and FP8 main entries\n"
    "\n"
    "  --model M       which examples (default all)\n"
    "  --context N     tokens per sequence instead of the example's own\n"
    "  --batch N       sequences (default 1)\n"
    "  --budget-gib X  also say whether each cache fits in X GiB\n"
    "  --bytes         exact byte counts instead of KiB/MiB/GiB\n"
    "  --stores        size DeepSeek-V4 layers by what kvc's dsv4 stores allocate (pages,\n"
    "                  tables, compressor state; planner::dsv4_store_footprint); skips the\n"
    "                  8192-wide indexer, which those stores refuse\n"
    "  --help          this text\n";

struct Example {
  ModelSpec spec;
  std::int64_t context;
};

std::vector<Example> examples(const std::string& which) {
  std::vector<Example> out;
  BlockSelectParams q4v;  // fp16k_q4v, W 1024, B 32, mean K
  BlockSelectParams q8 = q4v;
  q8.old_format = kvc::Format::kQ8;
  if (which == "all" || which == "llama") {
    const ModelSpec m = kvc::planner::llama31_8b();
    out.push_back({m, 131072});
    out.push_back({kvc::planner::with_block_select(m, q4v), 131072});
    out.push_back({kvc::planner::with_block_select(m, q8), 131072});
  }
  if (which == "all" || which == "smollm") {
    const ModelSpec m = kvc::planner::smollm2_135m();
    out.push_back({m, 8192});
    out.push_back({kvc::planner::with_block_select(m, q4v), 8192});
    out.push_back({kvc::planner::with_block_select(m, q8), 8192});
  }
  if (which == "all" || which == "dsv4") {
    Dsv4Options bf16;
    Dsv4Options fp8;
    fp8.entry_format = EntryFormat::kDsv4Fp8;
    Dsv4Options fp8_index;
    fp8_index.indexer_format = kvc::Format::kFp8E4m3;
    Dsv4Options mistake;
    mistake.indexer_format = kvc::Format::kBF16;
    mistake.indexer_dim = 8192;
    for (const Dsv4Options& o : {bf16, fp8, fp8_index, mistake}) {
      out.push_back({kvc::planner::deepseek_v4_flash(o), 1048576});
    }
    for (const Dsv4Options& o : {bf16, fp8}) {
      out.push_back({kvc::planner::deepseek_v4_pro(o), 1048576});
    }
  }
  return out;
}

[[noreturn]] void usage_error(const std::string& message) {
  std::cerr << "kvc_plan: " << message << "\n\n" << kUsage;
  std::exit(2);
}

std::int64_t parse_int(const std::string& flag, const char* text) {
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0') usage_error(flag + " needs an integer, got '" + text + "'");
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::string which = "all";
  std::int64_t context = 0;
  std::int64_t batch = 1;
  double budget_gib = -1.0;
  bool exact = false;
  bool stores = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      return 0;
    } else if (a == "--model") {
      which = value();
      if (which != "all" && which != "llama" && which != "smollm" && which != "dsv4") {
        usage_error("--model must be all, llama, smollm or dsv4, got '" + which + "'");
      }
    } else if (a == "--context") {
      context = parse_int(a, value());
    } else if (a == "--batch") {
      batch = parse_int(a, value());
    } else if (a == "--budget-gib") {
      const char* text = value();
      char* end = nullptr;
      budget_gib = std::strtod(text, &end);
      if (end == text || *end != '\0' || budget_gib < 0) {
        usage_error(std::string("--budget-gib needs a number >= 0, got '") + text + "'");
      }
    } else if (a == "--bytes") {
      exact = true;
    } else if (a == "--stores") {
      stores = true;
    } else {
      usage_error("unknown argument '" + a + "'");
    }
  }
  if (batch < 1 || batch > 65536) usage_error("--batch must be in [1, 65536]");

  try {
    for (const Example& e : examples(which)) {
      const bool dsv4 = e.spec.name.rfind("DeepSeek-V4", 0) == 0;
      if (stores && dsv4 && e.spec.name.find("wide indexer") != std::string::npos) continue;
      const std::int64_t n = context > 0 ? context : e.context;
      const auto f = stores && dsv4
                         ? kvc::planner::dsv4_store_footprint(e.spec, n, static_cast<int>(batch))
                         : kvc::planner::footprint(e.spec, n, static_cast<int>(batch));
      std::cout << f.table(exact);
      if (budget_gib >= 0) {
        const auto budget = static_cast<std::uint64_t>(budget_gib * 1073741824.0);
        std::cout << (f.fits(budget) ? "fits" : "does NOT fit") << " in " << budget_gib << " GiB\n";
      }
      std::cout << "\n";
    }
  } catch (const kvc::Error& err) {
    std::cerr << err.what() << "\n";
    return 1;
  }
  return 0;
}
