// Batch invariance (--deterministic, docs/ARCHITECTURE.md "Batch invariance"): one target
// sequence's logits, in fast precision, are bit-identical whatever runs beside it. The target
// is greedy-decoded alone, prompt in one piece, on one thread (the baseline), and then in
// randomised runs: companions of random lengths batched with it (their prefill chunks and
// decode steps in the same forward calls, in shuffled item order), its prompt cut into random
// chunks, with and without a prefix-cache hit, on 1-3 threads, in mono, in-process xAyF bundles
// with 1-3 micro-batches, EP and FFN tensor parallelism. Every logits row of the target (the
// last prompt position and each decode step) must equal the baseline's bit for bit.
// AFD wirings round the FFN input through FP8 and each FFN shard's partial through BF16: their
// baseline is mono with --afd-rounding y (the same rounding), as the trained-model tests use.
// Reference precision holds the invariant without the flag (EngineOptions::batch_invariant()).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>

#include "../model/model_test_util.h"
#include "model/tools/make_model.h"
#include "model/weights.h"
#include "runtime/engine_factory.h"

namespace afd {
namespace {

// A "tiny" preset checkpoint of `arch` (one per process and arch/dtype).
std::shared_ptr<const ModelWeights> tiny(Arch arch, DType dtype = DType::bf16) {
  static std::map<std::pair<int, int>, std::shared_ptr<const ModelWeights>> cache;
  const auto key = std::make_pair(static_cast<int>(arch), static_cast<int>(dtype));
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  auto c = make_preset_config(arch, "tiny");
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  if (!c.ok()) return nullptr;
  MakeModelOptions o;
  o.out_dir = test::process_scratch_dir(std::string("afd_batch_inv_") + arch_name(arch) + "_" + dtype_name(dtype));
  o.seed = 11;
  o.dtype = dtype;
  auto r = make_model(*c, o);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  auto w = load_model(o.out_dir);
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  return cache[key] = w.ok() ? *w : nullptr;
}

struct RunSetup {
  std::string topology = "mono";
  int microbatches = 0;
  int threads = 1;
  int rounding = 0;  // mono: --afd-rounding
  int ffn_tp = 1;
  DType kv = DType::bf16;
  // fast: with --deterministic; reference: without it (the precision is batch-invariant itself).
  Precision prec = Precision::fast;
};

std::string describe(const RunSetup& s) {
  return s.topology + " mb=" + std::to_string(s.microbatches) + " threads=" + std::to_string(s.threads) +
         " rounding=" + std::to_string(s.rounding) + " tp=" + std::to_string(s.ffn_tp) + " kv=" + dtype_name(s.kv) +
         " " + precision_name(s.prec);
}

std::unique_ptr<Engine> engine(std::shared_ptr<const ModelWeights> w, const RunSetup& s) {
  EngineOptions o;
  o.precision = s.prec;
  o.deterministic = s.prec == Precision::fast;
  o.n_threads = s.threads;
  o.topology = *parse_topology(s.topology);
  o.microbatches = s.microbatches;
  o.emulation.afd_rounding_shards = s.rounding;
  o.afd.ffn_tp = s.ffn_tp;
  o.kv.dtype = s.kv;
  o.kv.capacity_tokens = 4096;
  o.kv.max_seqs = 16;
  EXPECT_TRUE(o.validate().is_ok()) << o.validate().to_string();
  auto e = make_engine(o, std::move(w));
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return e.ok() ? std::move(*e) : nullptr;
}

int32_t argmax(const float* row, int64_t n) { return static_cast<int32_t>(std::max_element(row, row + n) - row); }

std::vector<int32_t> random_tokens(std::mt19937& rng, int64_t vocab, int n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(3 + rng() % static_cast<uint32_t>(vocab - 3));
  return t;
}

// How the target is run: seed 0 = alone, prompt whole; otherwise a random schedule of chunks
// and companions drawn from the seed. prefix_hit: the prompt was computed (and its sequence
// released) just before, so whole cached blocks of it are mapped instead of computed.
struct Schedule {
  uint64_t seed = 0;
  bool prefix_hit = false;
};

// The target's logits rows: the last prompt position's, then one per greedy decode step
// (n_new rows in all).
std::vector<std::vector<float>> target_rows(Engine& e, const std::vector<int32_t>& prompt, int n_new,
                                            const Schedule& sch) {
  const int64_t V = e.config().vocab_size;
  std::mt19937 rng(static_cast<uint32_t>(sch.seed * 7919 + 1));
  std::vector<std::vector<float>> rows;
  if (sch.prefix_hit) {
    auto s = e.create_sequence();
    EXPECT_TRUE(s.ok());
    BatchItem it{*s, prompt, false};
    std::vector<float> l;
    EXPECT_TRUE(e.forward({&it, 1}, &l).is_ok());
    e.release_sequence(*s);
  }
  struct Seq {
    int64_t id = -1;
    std::vector<int32_t> prompt;
    size_t done = 0;  // prompt tokens computed
    int32_t next = -1;  // decode: the token to append
    int left = 0;  // decode steps left (companions)
  };
  auto target = e.create_sequence();
  EXPECT_TRUE(target.ok());
  Seq t{*target, prompt};
  if (sch.prefix_hit) t.done = static_cast<size_t>(e.reuse_prefix(t.id, prompt));
  std::vector<Seq> comps;
  auto add_companion = [&] {
    auto s = e.create_sequence();
    if (!s.ok()) return;
    Seq c{*s, random_tokens(rng, V, 1 + static_cast<int>(rng() % 40))};
    c.left = static_cast<int>(rng() % 6);
    comps.push_back(std::move(c));
  };
  if (sch.seed != 0)
    for (int k = static_cast<int>(rng() % 4); k > 0; --k) add_companion();
  std::vector<int32_t> one_token;
  while (static_cast<int>(rows.size()) < n_new) {
    // Items: the target's next chunk or token, and each companion's with probability 3/4.
    struct Part {
      Seq* s;
      std::vector<int32_t> tokens;
    };
    std::vector<Part> parts;
    auto part_of = [&](Seq& s, bool whole) {
      Part p{&s, {}};
      if (s.done < s.prompt.size()) {
        const size_t left = s.prompt.size() - s.done;
        const size_t n = whole ? left : std::min<size_t>(left, 1 + rng() % 24);
        p.tokens.assign(s.prompt.begin() + static_cast<int64_t>(s.done),
                        s.prompt.begin() + static_cast<int64_t>(s.done + n));
      } else {
        p.tokens = {s.next};
      }
      return p;
    };
    parts.push_back(part_of(t, sch.seed == 0));
    for (Seq& c : comps)
      if (rng() % 4 != 0) parts.push_back(part_of(c, false));
    std::shuffle(parts.begin(), parts.end(), rng);
    std::vector<BatchItem> items;
    for (const Part& p : parts) items.push_back(BatchItem{p.s->id, p.tokens, false});
    std::vector<float> logits;
    Status st = e.forward(items, &logits);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    if (!st.is_ok()) return rows;
    for (size_t i = 0; i < parts.size(); ++i) {
      Seq& s = *parts[i].s;
      const float* row = logits.data() + static_cast<int64_t>(i) * V;
      const bool was_prompt = s.done < s.prompt.size();
      if (was_prompt) s.done += parts[i].tokens.size();
      else if (&s != &t) --s.left;
      if (s.done < s.prompt.size()) continue;  // mid-prompt: no token yet
      s.next = argmax(row, V);
      if (&s == &t) rows.emplace_back(row, row + V);
    }
    // Finished companions leave; new ones may arrive.
    for (size_t i = 0; i < comps.size();) {
      if (comps[i].done >= comps[i].prompt.size() && comps[i].left <= 0) {
        e.release_sequence(comps[i].id);
        comps.erase(comps.begin() + static_cast<int64_t>(i));
      } else {
        ++i;
      }
    }
    if (sch.seed != 0 && comps.size() < 4 && rng() % 3 == 0) add_companion();
  }
  for (Seq& c : comps) e.release_sequence(c.id);
  e.release_sequence(t.id);
  return rows;
}

// "" when every row of `got` has the bits of `want`'s, else where they first differ.
std::string first_difference(const std::vector<std::vector<float>>& want, const std::vector<std::vector<float>>& got) {
  if (want.size() != got.size()) return "row counts differ";
  for (size_t r = 0; r < want.size(); ++r) {
    if (want[r].size() == got[r].size() &&
        std::memcmp(want[r].data(), got[r].data(), want[r].size() * sizeof(float)) == 0)
      continue;
    float worst = 0;
    for (size_t k = 0; k < want[r].size() && k < got[r].size(); ++k)
      worst = std::max(worst, std::fabs(want[r][k] - got[r][k]));
    return "row " + std::to_string(r) + " differs (max |diff| " + std::to_string(worst) + ")";
  }
  return "";
}

constexpr int kNew = 6;

std::vector<int32_t> target_prompt(const ModelWeights& w) {
  std::mt19937 rng(5);
  return random_tokens(rng, w.config.vocab_size, 37);  // two whole 16-token blocks and a partial one
}

// Every setup against the baseline (its first element, run alone), over schedules.
void expect_invariant(Arch arch, DType dtype, const std::vector<RunSetup>& setups, const std::vector<Schedule>& schedules) {
  auto w = tiny(arch, dtype);
  ASSERT_NE(w, nullptr);
  const auto prompt = target_prompt(*w);
  auto base_engine = engine(w, setups[0]);
  ASSERT_NE(base_engine, nullptr);
  const auto want = target_rows(*base_engine, prompt, kNew, Schedule{});
  ASSERT_EQ(static_cast<int>(want.size()), kNew);
  for (const RunSetup& s : setups) {
    auto e = engine(w, s);
    ASSERT_NE(e, nullptr) << describe(s);
    for (const Schedule& sch : schedules) {
      const std::string d = first_difference(want, target_rows(*e, prompt, kNew, sch));
      EXPECT_EQ(d, "") << arch_name(arch) << " " << dtype_name(dtype) << ", " << describe(s) << ", schedule seed "
                       << sch.seed << (sch.prefix_hit ? " after a prefix-cache hit" : "");
    }
  }
}

const std::vector<Schedule> kSchedules = {{0, false}, {1, false}, {2, false}, {3, true}, {4, false}, {5, true}};

std::vector<RunSetup> mono_setups(DType kv) {
  std::vector<RunSetup> out;
  for (int threads : {1, 2, 3}) out.push_back(RunSetup{"mono", 0, threads, 0, 1, kv});
  return out;
}

class BatchInvariance : public ::testing::TestWithParam<Arch> {};

TEST_P(BatchInvariance, MonoAcrossBatchesChunksThreadsAndPrefixHits) {
  expect_invariant(GetParam(), DType::bf16, mono_setups(DType::bf16), kSchedules);
}

TEST_P(BatchInvariance, Fp8KvCache) {
  expect_invariant(GetParam(), DType::bf16, mono_setups(DType::f8_e4m3), {{0, false}, {1, false}, {3, true}});
}

TEST_P(BatchInvariance, Fp8Weights) {
  expect_invariant(GetParam(), DType::f8_e4m3, mono_setups(DType::bf16), {{0, false}, {2, false}, {5, true}});
}

// In-process bundles: x attention engines (the target lands on one of them), 1-3 micro-batches,
// y FFN workers with EP or TP; the baseline is mono with the bundle's rounding.
TEST_P(BatchInvariance, AfdWirings) {
  const std::vector<Schedule> sch = {{0, false}, {1, false}, {3, true}};
  expect_invariant(GetParam(), DType::bf16,
                   {RunSetup{"mono", 0, 1, 1}, RunSetup{"1A1F", 1, 1}, RunSetup{"1A1F", 3, 2}, RunSetup{"2A1F", 2, 3}}, sch);
  expect_invariant(GetParam(), DType::bf16, {RunSetup{"mono", 0, 1, 2}, RunSetup{"1A2F", 2, 2}, RunSetup{"2A2F", 1, 1}, RunSetup{"EP2", 1, 2}},
                   sch);
  expect_invariant(GetParam(), DType::bf16, {RunSetup{"mono", 0, 1, 2, 2}, RunSetup{"1A2F", 3, 2, 0, 2}}, sch);
}

// Reference precision without --deterministic: mono on 1-3 threads, and the AFD wirings whose
// token counts per expert differ most from mono's (EP, FFN workers with 3 micro-batches).
TEST_P(BatchInvariance, ReferencePrecisionWithoutTheFlag) {
  const Precision ref = Precision::reference;
  std::vector<RunSetup> mono;
  for (int threads : {1, 2, 3}) mono.push_back(RunSetup{"mono", 0, threads, 0, 1, DType::bf16, ref});
  expect_invariant(GetParam(), DType::bf16, mono, kSchedules);
  expect_invariant(GetParam(), DType::bf16,
                   {RunSetup{"mono", 0, 1, 2, 1, DType::bf16, ref}, RunSetup{"1A2F", 3, 2, 0, 1, DType::bf16, ref},
                    RunSetup{"EP2", 1, 2, 0, 1, DType::bf16, ref}},
                   {{0, false}, {1, false}, {3, true}});
}

INSTANTIATE_TEST_SUITE_P(Families, BatchInvariance,
                         ::testing::Values(Arch::qwen3_moe, Arch::deepseek_v3, Arch::step3_text),
                         [](const auto& info) { return std::string(arch_name(info.param)); });

}  // namespace
}  // namespace afd
