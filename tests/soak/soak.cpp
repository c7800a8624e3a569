// kvc_soak: a long decode loop over one layer's full block-select path (KvStore append ->
// BlockIndex score -> Selector select -> AttentionBackend decode) with slots reset, freed,
// reopened and refilled along the way. At every checkpoint it samples host RSS and (CUDA) free
// device memory, rebuilds a fresh store for the live slots from their token history (every K, V
// and q is a pure function of seed, slot, generation and position), recomputes the step and
// requires the same bytes: block scores, selected ids, outputs, LSE and the stores' snapshots.
// docs/soak.md describes it; scripts/soak runs the long soaks.
//
//   kvc_soak [--device cpu|cuda] [--steps N] [--checkpoint-every N] [--json PATH] [options]
//
// Exit codes: 0 pass, 1 a check failed, 2 bad arguments or an error, 77 no CUDA device (skip).
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvc/core/error.h"
#include "kvc/core/numeric.h"
#include "kvc/core/tensor.h"
#include "soak.h"

namespace kvc {
namespace soak {

KvStoreConfig Shape::store_config() const {
  KvStoreConfig c;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.max_slots = slots;
  c.max_context = max_context;
  c.recent_window = window;
  c.block_size = block_size;
  c.dtype = dtype;
  c.old_format = format;
  c.summaries = kSummaryMeanK | (uses_summaries(mode) ? kSummaryMeanV : 0u);
  return c;
}

BlockIndexConfig Shape::index_config() const {
  BlockIndexConfig c;
  c.num_q_heads = q_heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.dtype = dtype;
  c.max_batch = slots;
  return c;
}

AttentionConfig Shape::attention_config() const {
  AttentionConfig c;
  c.num_q_heads = q_heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.dtype = dtype;
  c.mode = mode;
  c.max_batch = slots;
  return c;
}

int Shape::max_selected() const {
  return SelectPolicy::topk(top_k).max_output(store_config().max_blocks_per_slot());
}

namespace {

constexpr int kSkipCode = 77;

// --- reproducible inputs: every value is a function of (seed, slot, generation, position) ---

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

enum class Stream : std::uint64_t { kKey = 1, kValue = 2, kQuery = 3, kLife = 4 };

std::uint64_t key_of(std::uint64_t seed, int slot, int generation, int position, Stream what) {
  std::uint64_t h = mix(seed);
  h = mix(h ^ static_cast<std::uint64_t>(slot));
  h = mix(h ^ static_cast<std::uint64_t>(generation));
  h = mix(h ^ static_cast<std::uint64_t>(static_cast<std::uint32_t>(position)));
  return mix(h ^ static_cast<std::uint64_t>(what));
}

// n values in [-2, 2), a triangular distribution (sum of two uniforms), from `key`, as f16 or
// bf16 bits.
void fill16(std::uint64_t key, std::size_t n, bool bf16, std::uint16_t* out) {
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t z = mix(key + i);
    const float a = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
    const float b = static_cast<float>((z >> 8) & 0xffffffu) * (1.0f / 16777216.0f);
    out[i] = float_to_bits16(2.0f * (a + b - 1.0f), bf16);
  }
}

// --- the schedule: each slot lives through generations (sequences) ------------------------

enum class LifeStart { kOpen, kReset, kFreeOpen };

struct Life {
  int generation = 0;
  int prefill = 0;  // tokens ingested at the start
  int target = 0;   // length at which the generation ends (<= max_context)
  int length = 0;   // tokens held now
  LifeStart start = LifeStart::kOpen;
};

Life plan_life(const Shape& s, std::uint64_t seed, int slot, int generation) {
  const std::uint64_t h = key_of(seed, slot, generation, 0, Stream::kLife);
  Life l;
  l.generation = generation;
  l.start =
      generation == 0 ? LifeStart::kOpen : ((h & 1u) ? LifeStart::kFreeOpen : LifeStart::kReset);
  // A quarter of the generations start empty; the others ingest up to half the context.
  l.prefill = ((h >> 1) & 3u) == 0 ? 0 : static_cast<int>((h >> 8) % (s.max_context / 2 + 1));
  const int max_decode = std::max(1, s.max_context / 8);
  // A quarter run until the slot is full (max_context), the others decode a few hundred steps.
  l.target =
      ((h >> 3) & 3u) == 0
          ? s.max_context
          : std::min(s.max_context, l.prefill + 1 + static_cast<int>((h >> 32) % max_decode));
  l.prefill = std::min(l.prefill, l.target - 1);
  l.length = l.prefill;
  return l;
}

// --- host memory -------------------------------------------------------------------------------

// Resident set size. Freed heap memory is first handed back to the system (malloc_trim), so the
// sample counts what is allocated (and fragmentation), not what the allocator keeps cached.
std::int64_t rss_kib() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  long long size = 0, resident = 0;
  const int n = std::fscanf(f, "%lld %lld", &size, &resident);
  std::fclose(f);
  if (n != 2) return -1;
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

// --- the CPU pipeline: the objects, as an engine calls them --------------------------------

class ObjectPipeline : public Pipeline {
 public:
  explicit ObjectPipeline(const Shape& s)
      : shape_(s),
        store_(KvStore::create(s.store_config(), Device::cpu())),
        index_(BlockIndex::create(s.index_config(), Device::cpu())),
        selector_(Selector::create(Device::cpu())),
        backend_(AttentionBackend::create(s.attention_config(), Device::cpu())),
        policy_(SelectPolicy::topk(s.top_k)),
        dtype_(s.dtype),
        slots_(static_cast<std::size_t>(s.slots)),
        q_(static_cast<std::size_t>(s.slots) * s.q_heads * s.head_dim) {
    for (int i = 0; i < s.slots; ++i) slots_[static_cast<std::size_t>(i)] = i;
    size(live_);
  }

  KvStore& store() override { return *store_; }
  void sync_host_state() override {}

  void ingest(KvStore& st, int slot, const std::vector<std::uint16_t>& k,
              const std::vector<std::uint16_t>& v, int tokens) override {
    st.ingest(slot, view16(k.data(), {tokens, shape_.kv_heads, shape_.head_dim}),
              view16(v.data(), {tokens, shape_.kv_heads, shape_.head_dim}));
  }

  void step(const std::vector<std::uint16_t>& k, const std::vector<std::uint16_t>& v,
            const std::vector<std::uint16_t>& q) override {
    const std::int64_t n = shape_.slots;
    store_->append(slots_, view16(k.data(), {n, shape_.kv_heads, shape_.head_dim}),
                   view16(v.data(), {n, shape_.kv_heads, shape_.head_dim}));
    std::copy(q.begin(), q.end(), q_.begin());
    run(*store_, live_);
  }

  void last_result(StepResult& r) override { r = live_; }

  void recompute(KvStore& fresh, StepResult& r) override {
    size(r);
    run(fresh, r);
  }

  std::int64_t device_free_bytes() override { return -1; }
  std::string describe() const override {
    return "CPU objects: KvStore::append, BlockIndex::score, Selector::select, "
           "AttentionBackend::decode";
  }

 private:
  TensorView view16(const std::uint16_t* p, std::initializer_list<std::int64_t> shape) {
    return TensorView::contiguous(const_cast<std::uint16_t*>(p), dtype_, shape);
  }

  void size(StepResult& r) const {
    const std::size_t rows = static_cast<std::size_t>(shape_.rows());
    const std::size_t maxb = static_cast<std::size_t>(shape_.store_config().max_blocks_per_slot());
    const std::size_t sel = static_cast<std::size_t>(shape_.max_selected());
    const std::size_t heads = static_cast<std::size_t>(shape_.slots) * shape_.q_heads;
    r.scores.assign(rows * maxb, 0.0f);
    r.num_valid.assign(rows, 0);
    r.ids.assign(rows * sel, 0);
    r.counts.assign(rows, 0);
    r.out.assign(heads * shape_.head_dim, 0.0f);
    r.lse.assign(heads, 0.0f);
  }

  // Poisons the outputs, then score -> select -> attend over `st` with q_.
  void run(const KvStore& st, StepResult& r) {
    std::fill(r.out.begin(), r.out.end(), std::nanf(""));
    std::fill(r.lse.begin(), r.lse.end(), std::nanf(""));
    std::fill(r.ids.begin(), r.ids.end(), -7);
    std::fill(r.counts.begin(), r.counts.end(), -7);
    const int rows = shape_.rows();
    const int maxb = shape_.store_config().max_blocks_per_slot();
    const std::int64_t n = shape_.slots;
    const TensorView q = view16(q_.data(), {n, 1, shape_.q_heads, shape_.head_dim});
    DecodeArgs a;
    a.slots = slots_;
    a.q = q;
    if (uses_selection(shape_.mode)) {
      const ScoresView sv{r.scores.data(), r.num_valid.data(), rows, maxb};
      index_->score(st, slots_, q, sv);
      a.selection =
          SelectionView{r.ids.data(), r.counts.data(), rows, shape_.max_selected(), false};
      selector_->select(sv, policy_, a.selection);
    }
    a.out =
        TensorView::contiguous(r.out.data(), DType::kF32, {n, 1, shape_.q_heads, shape_.head_dim});
    a.lse = TensorView::contiguous(r.lse.data(), DType::kF32, {n, 1, shape_.q_heads});
    backend_->decode(st, a);
  }

  Shape shape_;
  std::unique_ptr<KvStore> store_;
  std::unique_ptr<BlockIndex> index_;
  std::unique_ptr<Selector> selector_;
  std::unique_ptr<AttentionBackend> backend_;
  SelectPolicy policy_;
  DType dtype_;
  std::vector<int> slots_;
  std::vector<std::uint16_t> q_;
  StepResult live_;
};

// --- options -----------------------------------------------------------------------------------

struct Options {
  Shape shape;
  bool cuda = false;
  long long steps = 2000;
  long long checkpoint_every = 100;
  long long warmup_steps = -1;  // -1: max(10% of the steps, two checkpoints)
  std::string json;
  std::uint64_t seed = 1;
  long long rss_allowance_kib = 1024;
  int max_samples = 200;  // series points kept in the JSON
  int table_rows = 20;    // checkpoint rows printed
  // Self-test of the checks: "output" flips a bit of the live output at the second checkpoint,
  // "rss" holds 256 KiB more host memory at every checkpoint after warm-up.
  std::string inject = "none";
};

[[noreturn]] void usage(int code) {
  std::fprintf(code == 0 ? stdout : stderr,
               "usage: kvc_soak [--device cpu|cuda] [--steps N] [--checkpoint-every N]\n"
               "  [--json PATH] [--seed S] [--warmup-steps N] [--rss-allowance-kib K]\n"
               "  [--max-samples N] [--table-rows N] [--inject-fault none|output|rss]\n"
               "  [--slots N] [--kv-heads N] [--q-heads N] [--head-dim D] [--block-size B]\n"
               "  [--window W] [--max-context N] [--format F] [--mode M] [--top-k K]\n"
               "  [--dtype f16|bf16]  (of K, V, q; bf16 is required by --format bf16)\n"
               "  [--gpu-defaults]  (slots 4, kv heads 4, q heads 16, d 128, B 32, W 128,\n"
               "                     max context 4096, top 8; options after it override)\n"
               "exit: 0 pass, 1 a check failed, 2 usage or error, 77 no CUDA device (skipped)\n");
  std::exit(code);
}

long long to_int(const std::string& name, const std::string& value) {
  try {
    std::size_t used = 0;
    const long long x = std::stoll(value, &used);
    if (used == value.size()) return x;
  } catch (const std::exception&) {
  }
  std::fprintf(stderr, "kvc_soak: %s = '%s' is not an integer\n", name.c_str(), value.c_str());
  usage(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") usage(0);
    if (a == "--gpu-defaults") {
      o.shape.slots = 4;
      o.shape.kv_heads = 4;
      o.shape.q_heads = 16;
      o.shape.head_dim = 128;
      o.shape.block_size = 32;
      o.shape.window = 128;
      o.shape.max_context = 4096;
      o.shape.top_k = 8;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "kvc_soak: %s needs a value\n", a.c_str());
      usage(2);
    }
    const std::string v = argv[++i];
    const auto num = [&]() { return to_int(a, v); };
    if (a == "--device") {
      if (v != "cpu" && v != "cuda") usage(2);
      o.cuda = v == "cuda";
    } else if (a == "--steps") {
      o.steps = num();
    } else if (a == "--checkpoint-every") {
      o.checkpoint_every = num();
    } else if (a == "--warmup-steps") {
      o.warmup_steps = num();
    } else if (a == "--json") {
      o.json = v;
    } else if (a == "--seed") {
      o.seed = static_cast<std::uint64_t>(num());
    } else if (a == "--rss-allowance-kib") {
      o.rss_allowance_kib = num();
    } else if (a == "--max-samples") {
      o.max_samples = static_cast<int>(num());
    } else if (a == "--inject-fault") {
      if (v != "none" && v != "output" && v != "rss") usage(2);
      o.inject = v;
    } else if (a == "--table-rows") {
      o.table_rows = static_cast<int>(num());
    } else if (a == "--slots") {
      o.shape.slots = static_cast<int>(num());
    } else if (a == "--kv-heads") {
      o.shape.kv_heads = static_cast<int>(num());
    } else if (a == "--q-heads") {
      o.shape.q_heads = static_cast<int>(num());
    } else if (a == "--head-dim") {
      o.shape.head_dim = static_cast<int>(num());
    } else if (a == "--block-size") {
      o.shape.block_size = static_cast<int>(num());
    } else if (a == "--window") {
      o.shape.window = static_cast<int>(num());
    } else if (a == "--max-context") {
      o.shape.max_context = static_cast<int>(num());
    } else if (a == "--dtype") {
      if (v != "f16" && v != "bf16") usage(2);
      o.shape.dtype = v == "bf16" ? DType::kBF16 : DType::kF16;
    } else if (a == "--format") {
      o.shape.format = parse_format(v);
    } else if (a == "--mode") {
      o.shape.mode = parse_attention_mode(v);
    } else if (a == "--top-k") {
      o.shape.top_k = static_cast<int>(num());
    } else {
      std::fprintf(stderr, "kvc_soak: unknown option %s\n", a.c_str());
      usage(2);
    }
  }
  KVC_CHECK(o.steps >= 1, "--steps = ", o.steps, " must be >= 1");
  KVC_CHECK(o.checkpoint_every >= 1, "--checkpoint-every = ", o.checkpoint_every, " must be >= 1");
  KVC_CHECK(o.max_samples >= 2, "--max-samples = ", o.max_samples, " must be >= 2");
  KVC_CHECK(o.shape.max_context >= 2, "--max-context = ", o.shape.max_context, " must be >= 2");
  if (o.warmup_steps < 0) o.warmup_steps = std::max(o.steps / 10, 2 * o.checkpoint_every);
  return o;
}

// --- checkpoints and the report ------------------------------------------------------------

struct Sample {
  long long step = 0;
  double wall_s = 0;
  std::int64_t rss_kib = 0;
  std::int64_t device_free = -1;
  long long tokens = 0;  // tokens held by all slots
  int free_pool = 0;
  std::string lengths;  // "L0/L1/..."
  bool outputs_equal = false;
  bool selection_equal = false;
  bool snapshot_equal = false;
  double max_abs_diff = 0;
  int objects_equal = -1;  // CUDA: objects over the fresh store == the kernels (-1: not run)
  double objects_max_abs_diff = 0;
};

template <class T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// Bit equality of the block scores (the valid entries of each row), num_valid, ids and counts;
// true when the mode selects nothing (those buffers are then not written).
bool same_selection(const StepResult& a, const StepResult& b, int maxb, bool selects) {
  if (!selects) return true;
  bool eq = same_bytes(a.num_valid, b.num_valid) && same_bytes(a.counts, b.counts) &&
            same_bytes(a.ids, b.ids);
  for (std::size_t r = 0; eq && r < a.num_valid.size(); ++r) {
    const std::size_t n = static_cast<std::size_t>(std::max(0, a.num_valid[r]));
    eq = n <= static_cast<std::size_t>(maxb) &&
         (n == 0 || std::memcmp(&a.scores[r * maxb], &b.scores[r * maxb], n * sizeof(float)) == 0);
  }
  return eq;
}

// Bit equality of out and lse; the largest |out difference| (inf when either is NaN).
bool same_outputs(const StepResult& a, const StepResult& b, double* max_abs_diff) {
  double m = 0;
  for (std::size_t i = 0; i < a.out.size() && i < b.out.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a.out[i]) - b.out[i]);
    m = std::max(m, std::isnan(d) ? INFINITY : d);
  }
  *max_abs_diff = m;
  return same_bytes(a.out, b.out) && same_bytes(a.lse, b.lse);
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      o += ' ';
      continue;
    }
    o += c;
  }
  return o;
}

// Indices of at most `n` evenly spaced entries of [0, size), first and last included.
std::vector<std::size_t> decimate(std::size_t size, std::size_t n) {
  std::vector<std::size_t> idx;
  if (size <= n) {
    for (std::size_t i = 0; i < size; ++i) idx.push_back(i);
    return idx;
  }
  for (std::size_t j = 0; j < n; ++j) idx.push_back(j * (size - 1) / (n - 1));
  idx.erase(std::unique(idx.begin(), idx.end()), idx.end());
  return idx;
}

int run(const Options& o) {
  const Shape& sh = o.shape;
  const auto t_start = std::chrono::steady_clock::now();
  const auto now_s = [&]() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  };
  std::unique_ptr<Pipeline> pipe;
  Device device = Device::cpu();
  if (o.cuda) {
#if KVC_CUDA_ENABLED
    if (cuda_device_count() == 0) {
      std::printf("kvc_soak: SKIP: no CUDA device visible (the CUDA soak needs a GPU)\n");
      return kSkipCode;
    }
    device = Device::cuda(0);
    pipe = make_cuda_graph_pipeline(sh);
#else
    std::printf("kvc_soak: SKIP: kvc was built without CUDA (the CUDA soak needs it)\n");
    return kSkipCode;
#endif
  } else {
    pipe = std::make_unique<ObjectPipeline>(sh);
  }
  const KvStoreConfig sc = sh.store_config();
  KvStore& st = pipe->store();
  const std::size_t token = static_cast<std::size_t>(sh.kv_heads) * sh.head_dim;
  const std::size_t qtok = static_cast<std::size_t>(sh.q_heads) * sh.head_dim;
  const bool bf16 = sh.dtype == DType::kBF16;

  std::printf("kvc_soak: %s, %lld steps, checkpoint every %lld, warm-up %lld steps, seed %llu\n",
              to_string(device).c_str(), o.steps, o.checkpoint_every, o.warmup_steps,
              static_cast<unsigned long long>(o.seed));
  std::printf(
      "layer: %d slots (batch), Hkv %d, Hq %d, d %d, B %d, W %d, max_context %d, %s, %s, %s, "
      "top %d\n",
      sh.slots, sh.kv_heads, sh.q_heads, sh.head_dim, sh.block_size, sh.window, sh.max_context,
      to_string(sh.dtype), to_string(sh.format), to_string(sh.mode), sh.top_k);
  std::printf("path: %s\n", pipe->describe().c_str());

  // Host buffers sized once (so that RSS does not move with the lengths).
  std::vector<std::uint16_t> hist_k(static_cast<std::size_t>(sh.max_context) * token);
  std::vector<std::uint16_t> hist_v(hist_k.size());
  std::vector<std::uint16_t> step_k(sh.slots * token), step_v(sh.slots * token);
  std::vector<std::uint16_t> step_q(sh.slots * qtok);
  StepResult live, fresh_result, objects_result;
  std::string objects_note;

  // Fills hist_k / hist_v with tokens [0, n) of slot `s`, generation `g`.
  const auto history = [&](int s, int g, int n) {
    for (int p = 0; p < n; ++p) {
      fill16(key_of(o.seed, s, g, p, Stream::kKey), token, bf16, &hist_k[p * token]);
      fill16(key_of(o.seed, s, g, p, Stream::kValue), token, bf16, &hist_v[p * token]);
    }
  };

  std::vector<Life> lives(static_cast<std::size_t>(sh.slots));
  long long resets = 0, free_opens = 0, full = 0, prefilled_tokens = 0;
  for (int s = 0; s < sh.slots; ++s) {
    const int id = st.open_slot();
    KVC_CHECK(id == s, "open_slot() = ", id, " on a fresh store, expected ", s);
    Life& l = lives[static_cast<std::size_t>(s)];
    l = plan_life(sh, o.seed, s, 0);
    history(s, 0, l.prefill);
    pipe->ingest(st, s, hist_k, hist_v, l.prefill);
    prefilled_tokens += l.prefill;
  }

  std::vector<Sample> samples;
  samples.reserve(static_cast<std::size_t>(o.steps / o.checkpoint_every + 2));
  std::vector<std::string> failures;
  const auto fail = [&](long long step, const std::string& what) {
    if (failures.size() < 20) failures.push_back("step " + std::to_string(step) + ": " + what);
  };
  double checkpoint_s = 0;
  std::vector<int> freed;
  std::vector<std::vector<char>> injected;  // --inject-fault rss

  for (long long step = 1; step <= o.steps; ++step) {
    // 1. Ends of generations: reset or free + reopen, then the next generation's prefill.
    bool any = false;
    for (const Life& l : lives) any = any || l.length >= l.target;
    if (any) {
      pipe->sync_host_state();
      freed.clear();
      std::vector<int> ending;
      for (int s = 0; s < sh.slots; ++s) {
        Life& l = lives[static_cast<std::size_t>(s)];
        if (l.length < l.target) continue;
        if (st.length(s) != l.length) {
          fail(step, "slot " + std::to_string(s) + " length " + std::to_string(st.length(s)) +
                         ", expected " + std::to_string(l.length));
        }
        full += l.length == sh.max_context;
        ending.push_back(s);
        l = plan_life(sh, o.seed, s, l.generation + 1);
        if (l.start == LifeStart::kReset) {
          st.reset(s);
          ++resets;
        } else {
          st.free(s);
          freed.push_back(s);
          ++free_opens;
        }
      }
      for (int s : freed) {  // open_slot hands out the lowest free id first
        const int id = st.open_slot();
        if (id != s)
          fail(step, "open_slot() = " + std::to_string(id) + ", expected " + std::to_string(s));
      }
      for (int s : ending) {
        const Life& l = lives[static_cast<std::size_t>(s)];
        history(s, l.generation, l.prefill);
        pipe->ingest(st, s, hist_k, hist_v, l.prefill);
        prefilled_tokens += l.prefill;
      }
    }
    // 2. One decode step of every slot: the token at position `length` and its query.
    for (int s = 0; s < sh.slots; ++s) {
      Life& l = lives[static_cast<std::size_t>(s)];
      fill16(key_of(o.seed, s, l.generation, l.length, Stream::kKey), token, bf16,
             &step_k[s * token]);
      fill16(key_of(o.seed, s, l.generation, l.length, Stream::kValue), token, bf16,
             &step_v[s * token]);
      fill16(key_of(o.seed, s, l.generation, l.length, Stream::kQuery), qtok, bf16,
             &step_q[s * qtok]);
      ++l.length;
    }
    pipe->step(step_k, step_v, step_q);

    // 3. Checkpoint: memory, bookkeeping, and a fresh recomputation of this step.
    if (step % o.checkpoint_every != 0 && step != o.steps) continue;
    const double t0 = now_s();
    pipe->last_result(live);
    if (o.inject == "output" && samples.size() == 1)
      live.out[0] = std::nextafter(live.out[0], 1e30f);
    if (o.inject == "rss" && step > o.warmup_steps) {
      injected.emplace_back(256 * 1024, static_cast<char>(step));
    }
    pipe->sync_host_state();
    Sample smp;
    smp.step = step;
    smp.rss_kib = rss_kib();
    smp.device_free = pipe->device_free_bytes();
    int blocks_in_use = 0;
    for (int s = 0; s < sh.slots; ++s) {
      const Life& l = lives[static_cast<std::size_t>(s)];
      smp.tokens += l.length;
      smp.lengths += (s ? "/" : "") + std::to_string(l.length);
      if (st.length(s) != l.length) {
        fail(step, "slot " + std::to_string(s) + " length " + std::to_string(st.length(s)) +
                       ", expected " + std::to_string(l.length));
      }
      const int old = std::max(0, l.length - sh.window);
      blocks_in_use += (old + sh.block_size - 1) / sh.block_size;
    }
    smp.free_pool = st.free_pool_blocks();
    if (smp.free_pool != sc.pool_blocks() - blocks_in_use) {
      fail(step, "free pool blocks " + std::to_string(smp.free_pool) + ", expected " +
                     std::to_string(sc.pool_blocks() - blocks_in_use) + " (a block leaked?)");
    }
    {
      auto fresh = KvStore::create(sc, device);
      for (int s = 0; s < sh.slots; ++s) {
        const Life& l = lives[static_cast<std::size_t>(s)];
        fresh->open_slot();
        history(s, l.generation, l.length);
        pipe->ingest(*fresh, s, hist_k, hist_v, l.length);
      }
      pipe->recompute(*fresh, fresh_result);
      if (pipe->recompute_objects(*fresh, objects_result, &objects_note)) {
        smp.objects_equal = same_selection(objects_result, fresh_result, sc.max_blocks_per_slot(),
                                           uses_selection(sh.mode)) &&
                            same_outputs(objects_result, fresh_result, &smp.objects_max_abs_diff);
      }
      smp.snapshot_equal = st.snapshot() == fresh->snapshot();
    }
    const bool selects = uses_selection(sh.mode);
    smp.selection_equal = same_selection(live, fresh_result, sc.max_blocks_per_slot(), selects);
    smp.outputs_equal = same_outputs(live, fresh_result, &smp.max_abs_diff);
    for (float x : live.out) {
      if (!std::isfinite(x)) {
        smp.outputs_equal = false;
        fail(step, "non-finite output");
        break;
      }
    }
    if (!smp.selection_equal) fail(step, "scores / selection differ from the fresh recomputation");
    if (!smp.outputs_equal) {
      fail(step, "outputs differ from the fresh recomputation (max |diff| " +
                     std::to_string(smp.max_abs_diff) + ")");
    }
    if (!smp.snapshot_equal) fail(step, "store snapshot differs from the fresh store's");
    checkpoint_s += now_s() - t0;
    smp.wall_s = now_s();
    samples.push_back(smp);
  }
  const double wall = now_s();

  // --- memory verdict: flat after warm-up ------------------------------------------------------
  std::size_t base = samples.size() - 1;
  for (std::size_t i = 0; i < samples.size(); ++i) {
    if (samples[i].step > o.warmup_steps) {
      base = i;
      break;
    }
  }
  std::int64_t rss_peak = 0, rss_peak_after = 0, dev_min = -1, dev_max = -1;
  for (std::size_t i = 0; i < samples.size(); ++i) {
    rss_peak = std::max(rss_peak, samples[i].rss_kib);
    if (i < base) continue;
    rss_peak_after = std::max(rss_peak_after, samples[i].rss_kib);
    if (samples[i].device_free >= 0) {
      dev_min = dev_min < 0 ? samples[i].device_free : std::min(dev_min, samples[i].device_free);
      dev_max = std::max(dev_max, samples[i].device_free);
    }
  }
  const Sample& b = samples[base];
  const std::int64_t rss_growth = rss_peak_after - b.rss_kib;
  if (rss_growth > o.rss_allowance_kib) {
    fail(b.step, "host RSS grew by " + std::to_string(rss_growth) +
                     " KiB after warm-up (allowance " + std::to_string(o.rss_allowance_kib) +
                     " KiB)");
  }
  if (dev_min >= 0 && dev_min != dev_max) {
    fail(b.step, "free device memory moved after warm-up: " + std::to_string(dev_min) + " .. " +
                     std::to_string(dev_max) + " bytes");
  }
  long long equal = 0;
  for (const Sample& s : samples) {
    equal += s.outputs_equal && s.selection_equal && s.snapshot_equal;
  }
  const bool pass = failures.empty();

  // --- table -------------------------------------------------------------------------------------
  std::printf("\n%9s %8s %8s %-26s %9s %12s %6s %s\n", "step", "wall s", "tokens", "slot lengths",
              "RSS KiB", "dev free MiB", "pool", "equal (out/sel/snap)");
  const auto idx = decimate(samples.size(), static_cast<std::size_t>(std::max(2, o.table_rows)));
  std::size_t next = 0;
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const Sample& s = samples[i];
    const bool bad = !(s.outputs_equal && s.selection_equal && s.snapshot_equal);
    const bool listed = next < idx.size() && idx[next] == i;
    if (listed) ++next;
    if (!listed && !bad) continue;
    char dev[32] = "-";
    if (s.device_free >= 0) std::snprintf(dev, sizeof dev, "%.1f", s.device_free / 1048576.0);
    std::printf("%9lld %8.1f %8lld %-26s %9lld %12s %6d %s/%s/%s%s\n", s.step, s.wall_s, s.tokens,
                s.lengths.c_str(), static_cast<long long>(s.rss_kib), dev, s.free_pool,
                s.outputs_equal ? "y" : "N", s.selection_equal ? "y" : "N",
                s.snapshot_equal ? "y" : "N", i == base ? "  <- memory baseline" : "");
  }
  std::printf(
      "\nsteps %lld in %.1f s (%.0f steps/s; checkpoints %.1f s); generations: %lld resets, "
      "%lld free+reopen, %lld reached max_context; %lld tokens prefilled\n",
      o.steps, wall, o.steps / wall, checkpoint_s, resets, free_opens, full, prefilled_tokens);
  std::printf(
      "RSS KiB: start %lld, baseline %lld (step %lld), peak after %lld, end %lld, growth %lld "
      "(allowance %lld)\n",
      static_cast<long long>(samples.front().rss_kib), static_cast<long long>(b.rss_kib), b.step,
      static_cast<long long>(rss_peak_after), static_cast<long long>(samples.back().rss_kib),
      static_cast<long long>(rss_growth), o.rss_allowance_kib);
  if (dev_min >= 0) {
    std::printf("device free bytes after warm-up: min %lld, max %lld (%s)\n",
                static_cast<long long>(dev_min), static_cast<long long>(dev_max),
                dev_min == dev_max ? "flat" : "MOVED");
  }
  std::printf("checkpoints equal to a fresh recomputation: %lld of %zu\n", equal, samples.size());
  long long obj_run = 0, obj_equal = 0;
  double obj_diff = 0;
  for (const Sample& s : samples) {
    if (s.objects_equal < 0) continue;
    ++obj_run;
    obj_equal += s.objects_equal;
    obj_diff = std::max(obj_diff, s.objects_max_abs_diff);
  }
  if (o.cuda) {
    if (obj_run > 0) {
      std::printf(
          "cross-check (not in the verdict): the CUDA objects (BlockIndex, Selector, "
          "AttentionBackend) over the fresh store equal the graph's kernels at %lld of "
          "%lld checkpoints (max |out diff| %.3g)%s\n",
          obj_equal, obj_run, obj_diff, obj_equal == obj_run ? "" : "  WARN");
    } else {
      std::printf("cross-check with the CUDA objects not run: %s\n", objects_note.c_str());
    }
  }
  for (const std::string& f : failures) std::printf("FAIL %s\n", f.c_str());
  std::printf("verdict: %s\n", pass ? "PASS" : "FAIL");

  // --- JSON --------------------------------------------------------------------------------------
  if (!o.json.empty()) {
    std::ostringstream j;
    j << "{\n  \"tool\": \"kvc_soak\",\n  \"device\": \"" << to_string(device) << "\",\n";
    j << "  \"path\": \"" << json_escape(pipe->describe()) << "\",\n";
    j << "  \"config\": {\"slots\": " << sh.slots << ", \"kv_heads\": " << sh.kv_heads
      << ", \"q_heads\": " << sh.q_heads << ", \"head_dim\": " << sh.head_dim
      << ", \"block_size\": " << sh.block_size << ", \"window\": " << sh.window
      << ", \"max_context\": " << sh.max_context << ", \"dtype\": \"" << to_string(sh.dtype)
      << "\", \"format\": \"" << to_string(sh.format) << "\", \"mode\": \"" << to_string(sh.mode)
      << "\", \"top_k\": " << sh.top_k << ", \"seed\": " << o.seed << "},\n";
    j << "  \"steps\": " << o.steps << ",\n  \"checkpoint_every\": " << o.checkpoint_every
      << ",\n  \"warmup_steps\": " << o.warmup_steps << ",\n  \"wall_s\": " << wall
      << ",\n  \"checkpoint_s\": " << checkpoint_s << ",\n";
    j << "  \"generations\": {\"resets\": " << resets << ", \"free_reopen\": " << free_opens
      << ", \"reached_max_context\": " << full << ", \"prefilled_tokens\": " << prefilled_tokens
      << "},\n";
    j << "  \"checkpoints\": {\"count\": " << samples.size() << ", \"equal\": " << equal
      << ", \"comparison\": \"bit-identical: scores, ids, counts, out (f32), lse, snapshots\"},\n";
    j << "  \"objects_cross_check\": {\"run\": " << obj_run << ", \"equal\": " << obj_equal
      << ", \"max_abs_out_diff\": " << obj_diff << ", \"note\": \"" << json_escape(objects_note)
      << "\"},\n";
    j << "  \"memory\": {\"rss_kib_start\": " << samples.front().rss_kib
      << ", \"rss_kib_baseline\": " << b.rss_kib << ", \"baseline_step\": " << b.step
      << ", \"rss_kib_peak\": " << rss_peak << ", \"rss_kib_peak_after_warmup\": " << rss_peak_after
      << ", \"rss_kib_end\": " << samples.back().rss_kib
      << ", \"rss_allowance_kib\": " << o.rss_allowance_kib
      << ", \"device_free_min_after_warmup\": " << dev_min
      << ", \"device_free_max_after_warmup\": " << dev_max << "},\n";
    const auto series = decimate(samples.size(), static_cast<std::size_t>(o.max_samples));
    j << "  \"series_note\": \"one entry per checkpoint, " << series.size() << " of "
      << samples.size() << " kept (evenly spaced, first and last included)\",\n";
    const auto column = [&](const char* name, auto get, bool last) {
      j << "    \"" << name << "\": [";
      for (std::size_t i = 0; i < series.size(); ++i)
        j << (i ? ", " : "") << get(samples[series[i]]);
      j << "]" << (last ? "\n" : ",\n");
    };
    j << "  \"series\": {\n";
    column(
        "step", [](const Sample& s) { return s.step; }, false);
    column(
        "rss_kib", [](const Sample& s) { return s.rss_kib; }, false);
    column(
        "device_free_bytes", [](const Sample& s) { return s.device_free; }, false);
    column(
        "tokens", [](const Sample& s) { return s.tokens; }, false);
    column(
        "free_pool_blocks", [](const Sample& s) { return s.free_pool; }, false);
    column(
        "slot_lengths", [](const Sample& s) { return "\"" + s.lengths + "\""; }, false);
    column(
        "max_abs_out_diff", [](const Sample& s) { return s.max_abs_diff; }, false);
    column(
        "equal",
        [](const Sample& s) {
          return (s.outputs_equal && s.selection_equal && s.snapshot_equal) ? 1 : 0;
        },
        true);
    j << "  },\n  \"failures\": [";
    for (std::size_t i = 0; i < failures.size(); ++i) {
      j << (i ? ", " : "") << "\"" << json_escape(failures[i]) << "\"";
    }
    j << "],\n  \"verdict\": \"" << (pass ? "pass" : "fail") << "\"\n}\n";
    std::ofstream f(o.json);
    f << j.str();
    if (!f) {
      std::fprintf(stderr, "kvc_soak: cannot write %s\n", o.json.c_str());
      return 2;
    }
  }
  return pass ? 0 : 1;
}

}  // namespace
}  // namespace soak
}  // namespace kvc

int main(int argc, char** argv) {
  try {
    return kvc::soak::run(kvc::soak::parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvc_soak: error: %s\n", e.what());
    return 2;
  }
}
