// kvc_quality: the synthetic retrieval suite (docs/quality-synthetic.md). Builds caches with
// planted needles at several lengths, runs every attention mode and format over them, writes one
// JSONL row per (case, length, seed, format, mode, budget) and a markdown summary, and exits
// non-zero when a claim fails (dense must pass every case, the recent-window modes must fail every
// case, block_select_exact top 8 must pass every case dense passes).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kvc/attention/attention.h"
#include "kvc/config.h"
#include "kvc/core/error.h"
#include "kvc/core/types.h"
#include "kvc/select/selector.h"
#include "quality.h"

#if KVC_CUDA_ENABLED
#include <cuda_runtime.h>
#endif

namespace kq = kvc_quality;

namespace {

const char* const kUsage =
    "usage: kvc_quality [--smoke] [--lengths LIST] [--cases LIST] [--modes LIST]\n"
    "                   [--formats LIST] [--budgets LIST] [--seeds N] [--threads N]\n"
    "                   [--device auto|cpu|cuda] [--jsonl PATH] [--summary PATH] [options]\n"
    "\n"
    "Synthetic retrieval suite: KV caches of random tokens with planted needles whose keys the\n"
    "query attends strongly and whose values carry a pattern; checks which attention modes still\n"
    "recover the needles (docs/quality-synthetic.md). Exit status 1 when a claim fails.\n"
    "\n"
    "  --smoke           2K and 4K; modes dense, dense_recent_only, recent_only, exact top 4/8;\n"
    "                    formats f16, fp16k_q4v (what ctest runs)\n"
    "  --lengths LIST    tokens per case, e.g. 2K,4K,8K (K = 1024; default 2K,4K,8K,16K,32K)\n"
    "  --cases LIST      single,multi,distractor,boundary,far_apart (default all)\n"
    "  --modes LIST      dense,dense_recent_only,recent_only,block_summary,block_select_lossy,\n"
    "                    block_select_exact (default all)\n"
    "  --formats LIST    f16,q8,fp16k_q4v (default all; also bf16)\n"
    "  --budgets LIST    top-k of block_select_exact (default 4,8,16)\n"
    "  --lossy-budget N  top-k of block_select_lossy (default 8)\n"
    "  --representatives N  exact representatives per block in the lossy modes (default 0)\n"
    "  --scoring S       block score: mean_k (default), quest (min/max K upper bound) or\n"
    "                    token_mass (kvc's default: every old token's mxfp4 index key)\n"
    "  --candidates C    token_mass in two stages: mean K keeps C blocks (and block 0) first\n"
    "  --aggregate A     GQA aggregation of the block score: sum (default) or max\n"
    "  --seeds N         random cases per (case, length) (default 1)\n"
    "  --threads N       cases run in parallel (default: hardware threads up to 8; 1 on CUDA)\n"
    "  --device D        auto (default: CUDA when every part runs there, else CPU), cpu, cuda\n"
    "  --jsonl PATH      write the rows (default: none)\n"
    "  --summary PATH    write the markdown summary (default: none)\n"
    "  --margin X        needle logit above the background log-sum-exp (default 3)\n"
    "  --distractor-gap X  needle logit minus distractor logit (default 2)\n"
    "  --distractors N   distractors of the distractor case (default 4)\n"
    "  --multi-needles N needles of the multi case (default 3)\n"
    "  --pass-fraction X each needle's coefficient must reach X / needles (default 0.5)\n"
    "  --kv-heads N, --group N, --head-dim N, --recent-window N, --block-size N\n"
    "                    layer shape (default 2, 4, 128, 1024, 32)\n"
    "  --note TEXT       a line for the summary's header (e.g. the script that ran it)\n"
    "  --quiet           no progress on stderr\n";

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

int parse_int(const std::string& s, const char* what) {
  std::size_t used = 0;
  long long v = 0;
  try {
    std::string t = s;
    long long mult = 1;
    if (!t.empty() && (t.back() == 'K' || t.back() == 'k')) {
      mult = 1024;
      t.pop_back();
    }
    v = std::stoll(t, &used) * mult;
    if (used != t.size()) throw std::invalid_argument(s);
  } catch (const std::exception&) {
    throw kvc::Error(std::string(what) + " = '" + s + "' is not an integer");
  }
  if (v < 0 || v > 1'000'000'000)
    throw kvc::Error(std::string(what) + " = '" + s + "' out of range");
  return static_cast<int>(v);
}

double parse_double(const std::string& s, const char* what) {
  try {
    std::size_t used = 0;
    const double v = std::stod(s, &used);
    if (used == s.size()) return v;
  } catch (const std::exception&) {
  }
  throw kvc::Error(std::string(what) + " = '" + s + "' is not a number");
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", std::gmtime(&t));
  return buf;
}

std::string machine(kvc::Device dev) {
  std::string cpu = "unknown CPU";
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  std::string m =
      cpu + ", " + std::to_string(std::thread::hardware_concurrency()) + " hardware threads";
#if KVC_CUDA_ENABLED
  if (dev.is_cuda()) {
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, dev.index) == cudaSuccess) m += "; GPU " + std::string(p.name);
  }
#else
  (void)dev;
#endif
  return m;
}

// The one place that picks the device: the request, or for "auto" kvc::default_device() unless
// a part of the pipeline has no implementation there yet (then the CPU, with a note).
kvc::Device pick_device(const std::string& request, std::string* note) {
  if (request == "cpu") return kvc::Device::cpu();
  if (request == "cuda") return kvc::Device::cuda(0);
  if (request != "auto") throw kvc::Error("--device = '" + request + "' is not auto, cpu or cuda");
  const kvc::Device d = kvc::default_device();
  if (d.is_cpu()) return d;
  try {
    kvc::AttentionConfig c;
    c.num_q_heads = 8;
    c.num_kv_heads = 2;
    c.head_dim = 128;
    kvc::AttentionBackend::create(c, d);
    kvc::Selector::create(d);
  } catch (const kvc::Error&) {
    *note = " (" + kvc::to_string(d) + " present, but not every part runs there yet)";
    return kvc::Device::cpu();
  }
  return d;
}

struct Job {
  kq::CaseKind kind;
  int length;
  int seed;
};

int run(int argc, char** argv) {
  kq::SuiteOptions o;
  std::vector<int> lengths = {2048, 4096, 8192, 16384, 32768};
  std::vector<kq::CaseKind> cases = kq::all_cases();
  int seeds = 1;
  // A 128K case holds about 0.4 GB while it runs: at most 8 by default.
  int threads = static_cast<int>(std::min(8u, std::max(1u, std::thread::hardware_concurrency())));
  bool threads_set = false;
  std::string device_request = "auto", jsonl_path, summary_path;
  bool quiet = false;
  std::string note_text;
  std::string command = "kvc_quality";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    command += a.find(' ') == std::string::npos ? " " + a : " '" + a + "'";
  }

  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw kvc::Error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      return 0;
    } else if (a == "--smoke") {
      lengths = {2048, 4096};
      o.modes = {"dense", "dense_recent_only", "recent_only", "block_select_exact"};
      o.budgets = {4, 8};
      o.formats = {kvc::Format::kF16, kvc::Format::kFp16kQ4v};
    } else if (a == "--lengths") {
      lengths.clear();
      for (const std::string& s : split(value())) lengths.push_back(parse_int(s, "--lengths"));
    } else if (a == "--cases") {
      cases.clear();
      for (const std::string& s : split(value())) cases.push_back(kq::parse_case(s));
    } else if (a == "--modes") {
      o.modes = split(value());
      for (const std::string& m : o.modes) kvc::parse_attention_mode(m);
    } else if (a == "--formats") {
      o.formats.clear();
      for (const std::string& s : split(value())) o.formats.push_back(kvc::parse_format(s));
    } else if (a == "--budgets") {
      o.budgets.clear();
      for (const std::string& s : split(value())) o.budgets.push_back(parse_int(s, "--budgets"));
    } else if (a == "--lossy-budget") {
      o.lossy_budget = parse_int(value(), "--lossy-budget");
    } else if (a == "--representatives") {
      o.lossy_representatives = parse_int(value(), "--representatives");
    } else if (a == "--scoring") {
      const std::string v = value();
      if (v != "mean_k" && v != "quest" && v != "token_mass")
        throw kvc::Error("--scoring = '" + v + "' is not mean_k, quest or token_mass");
      o.score = v == "quest"        ? kvc::SummaryScore::kQuestMinMax
                : v == "token_mass" ? kvc::SummaryScore::kTokenMass
                                    : kvc::SummaryScore::kMeanK;
    } else if (a == "--candidates") {
      o.candidates = parse_int(value(), "--candidates");
      if (o.candidates < 0)
        throw kvc::Error("--candidates = " + std::to_string(o.candidates) + " is negative");
    } else if (a == "--aggregate") {
      const std::string v = value();
      if (v != "sum" && v != "max") throw kvc::Error("--aggregate = '" + v + "' is not sum or max");
      o.aggregate = v == "max" ? kvc::GqaAggregate::kMax : kvc::GqaAggregate::kSum;
    } else if (a == "--seeds") {
      seeds = parse_int(value(), "--seeds");
    } else if (a == "--threads") {
      threads = std::max(1, parse_int(value(), "--threads"));
      threads_set = true;
    } else if (a == "--device") {
      device_request = value();
    } else if (a == "--jsonl") {
      jsonl_path = value();
    } else if (a == "--summary") {
      summary_path = value();
    } else if (a == "--margin") {
      o.needles.margin = parse_double(value(), "--margin");
    } else if (a == "--distractor-gap") {
      o.needles.distractor_gap = parse_double(value(), "--distractor-gap");
    } else if (a == "--distractors") {
      o.needles.distractors = parse_int(value(), "--distractors");
    } else if (a == "--multi-needles") {
      o.needles.multi_needles = parse_int(value(), "--multi-needles");
    } else if (a == "--pass-fraction") {
      o.needles.pass_fraction = parse_double(value(), "--pass-fraction");
    } else if (a == "--kv-heads") {
      o.geo.num_kv_heads = parse_int(value(), "--kv-heads");
    } else if (a == "--group") {
      o.geo.group = parse_int(value(), "--group");
    } else if (a == "--head-dim") {
      o.geo.head_dim = parse_int(value(), "--head-dim");
    } else if (a == "--recent-window") {
      o.geo.recent_window = parse_int(value(), "--recent-window");
    } else if (a == "--block-size") {
      o.geo.block_size = parse_int(value(), "--block-size");
    } else if (a == "--note") {
      note_text = value();
    } else if (a == "--quiet") {
      quiet = true;
    } else {
      std::cerr << "kvc_quality: unknown argument '" << a << "'\n" << kUsage;
      return 2;
    }
  }
  if (seeds < 1) throw kvc::Error("--seeds must be >= 1");
  if (o.needles.multi_needles < 1) throw kvc::Error("--multi-needles must be >= 1");
  if (o.candidates > 0 && o.score != kvc::SummaryScore::kTokenMass)
    throw kvc::Error("--candidates = " + std::to_string(o.candidates) +
                     " needs --scoring token_mass (two stages rank by token mass)");
  if (o.geo.num_kv_heads < 1 || o.geo.group < 1)
    throw kvc::Error("--kv-heads, --group must be >= 1");

  std::string note;
  const kvc::Device dev = pick_device(device_request, &note);
  if (dev.is_cuda() && !threads_set) threads = 1;

  std::vector<Job> jobs;
  for (int L : lengths)
    for (kq::CaseKind k : cases)
      for (int s = 0; s < seeds; ++s) jobs.push_back({k, L, s});
  // Longest first, so the big cases do not finish last on one thread.
  std::vector<std::size_t> order(jobs.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return jobs[a].length > jobs[b].length; });

  if (!quiet) {
    std::cerr << "kvc_quality: " << jobs.size() << " cases on " << kvc::to_string(dev) << note
              << ", " << threads << " thread(s)\n";
  }
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::vector<kq::Row>> results(jobs.size());
  std::atomic<std::size_t> next{0};
  std::atomic<int> done{0};
  std::mutex mu;
  std::exception_ptr failure;
  auto worker = [&]() {
    for (;;) {
      const std::size_t n = next.fetch_add(1);
      if (n >= order.size()) return;
      const Job& j = jobs[order[n]];
      try {
        const kq::NeedleCase c = kq::build_case(j.kind, j.length, j.seed, o.geo, o.needles);
        results[order[n]] = kq::run_case(c, o, dev);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!failure) failure = std::current_exception();
        next = order.size();
        return;
      }
      const int k = ++done;
      if (!quiet) {
        const double t =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::lock_guard<std::mutex> lock(mu);
        std::fprintf(stderr, "  [%d/%zu] %-10s N=%-6d seed %d  (%.0f s)\n", k, jobs.size(),
                     kq::to_string(j.kind), j.length, j.seed, t);
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (std::thread& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::vector<kq::Row> rows;
  for (auto& r : results) rows.insert(rows.end(), r.begin(), r.end());
  if (!jsonl_path.empty()) {
    std::ofstream f(jsonl_path);
    if (!f) throw kvc::Error("cannot write --jsonl " + jsonl_path);
    for (const kq::Row& r : rows) f << kq::to_json(r, o.geo) << "\n";
  }
  kq::RunInfo info;
  info.date = utc_now();
  info.machine = machine(dev);
  info.command = command;
  info.device = kvc::to_string(dev) + note;
  info.seconds = seconds;
  info.note = note_text;
  if (!summary_path.empty()) {
    std::ofstream f(summary_path);
    if (!f) throw kvc::Error("cannot write --summary " + summary_path);
    f << kq::summary_markdown(rows, o, info);
  }

  // Console: pass counts per mode, then the verdict.
  std::map<std::string, std::pair<int, int>> counts;
  std::vector<std::string> keys;
  for (const kq::Row& r : rows) {
    const std::string key = r.mode + (r.budget > 0 ? " top " + std::to_string(r.budget) : "");
    if (!counts.count(key)) keys.push_back(key);
    counts[key].first += r.pass;
    ++counts[key].second;
  }
  std::printf("kvc_quality: %zu rows in %.1f s on %s\n", rows.size(), seconds, info.device.c_str());
  for (const std::string& k : keys)
    std::printf("  %-26s %5d / %-5d pass\n", k.c_str(), counts[k].first, counts[k].second);
  const std::vector<kq::Violation> violations = kq::check_claims(rows);
  for (const kq::Violation& v : violations) std::printf("FAIL: %s\n", v.what.c_str());
  if (violations.empty()) {
    std::printf(
        "claims hold: dense passes every case, the recent-window modes fail every case, "
        "block_select_exact top 8 passes every dense-valid case\n");
  }
  return violations.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvc_quality: %s\n", e.what());
    return 2;
  }
}
