#include <gtest/gtest.h>

#include "runtime/topology.h"

namespace afd {
namespace {

TEST(Topology, Parses) {
  auto t = parse_topology("2A1F");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->wiring, Wiring::afd);
  EXPECT_EQ(t->n_attention, 2);
  EXPECT_EQ(t->n_ffn, 1);
  EXPECT_EQ(t->to_string(), "2A1F");
  EXPECT_EQ(parse_topology("mono")->wiring, Wiring::mono);
  auto ep = parse_topology("EP4");
  ASSERT_TRUE(ep.ok());
  EXPECT_EQ(ep->wiring, Wiring::ep);
  EXPECT_EQ(ep->n_ffn, 4);
  for (const char* bad : {"", "2A", "A1F", "0A1F", "2A0F", "2X1F", "99A1F", "EP0", "1A1Fx", "-1A1F"})
    EXPECT_FALSE(parse_topology(bad).ok()) << bad;
}

// The typed value EngineOptions holds: to_string() gives the canonical spelling, which parses
// back to the same wiring and worker counts; the default is mono.
TEST(Topology, CanonicalSpellingRoundTrips) {
  EXPECT_EQ(Topology{}.to_string(), "mono");
  for (const char* s : {"mono", "monolithic", "1A1F", "2a3f", "64A64F", "EP2", "ep8"}) {
    auto t = parse_topology(s);
    ASSERT_TRUE(t.ok()) << s;
    auto back = parse_topology(t->to_string());
    ASSERT_TRUE(back.ok()) << t->to_string();
    EXPECT_EQ(back->wiring, t->wiring) << s;
    EXPECT_EQ(back->n_attention, t->n_attention) << s;
    EXPECT_EQ(back->n_ffn, t->n_ffn) << s;
  }
  EXPECT_EQ(parse_topology("2a3f")->to_string(), "2A3F");
  EXPECT_EQ(parse_topology("monolithic")->to_string(), "mono");
}

TEST(Topology, ShardsCoverEveryExpertOnce) {
  for (int y : {1, 2, 3, 5, 8}) {
    Topology t = *parse_topology("1A" + std::to_string(y) + "F");
    std::vector<int> owners(37, 0);
    int shared = 0;
    for (int s = 0; s < y; ++s) {
      ExpertRange r = t.ffn_shard(s, 37);
      for (int64_t e = r.begin; e < r.end; ++e) owners[e]++;
      shared += r.holds_shared;
    }
    for (int o : owners) EXPECT_EQ(o, 1);
    EXPECT_EQ(shared, 1);
  }
}

// --ffn-tp t: worker s is TP rank s % t of EP group s / t; group 0 holds the shared part.
TEST(Topology, TpShards) {
  for (int y : {2, 4, 8}) {
    for (int t = 1; t <= y; t *= 2) {
      std::vector<int> slices(37, 0);
      int shared = 0;
      for (int s = 0; s < y; ++s) {
        ExpertRange r = ffn_shard_range(s, y, t, 37);
        EXPECT_EQ(r.tp_degree, t);
        EXPECT_EQ(r.tp_rank, s % t);
        EXPECT_EQ(r.holds_shared, s < t);
        shared += r.holds_shared;
        for (int64_t e = r.begin; e < r.end; ++e) slices[e]++;
      }
      EXPECT_EQ(shared, t);
      for (int e = 0; e < 37; ++e) EXPECT_EQ(slices[e], t) << "y " << y << " t " << t << " expert " << e;
    }
  }
  Topology topo = *parse_topology("1A4F");
  topo.ffn_tp = 2;
  EXPECT_EQ(topo.ffn_shard(3, 8).begin, 4);
  EXPECT_EQ(topo.ffn_shard(3, 8).tp_rank, 1);
  EXPECT_EQ(topo.ffn_shard(1, 8).end, 4);
}

TEST(Topology, ShardSpec) {
  int i, y;
  ASSERT_TRUE(parse_shard("1/2", &i, &y).is_ok());
  EXPECT_EQ(i, 1);
  EXPECT_EQ(y, 2);
  EXPECT_FALSE(parse_shard("2/2", &i, &y).is_ok());
  EXPECT_FALSE(parse_shard("x/2", &i, &y).is_ok());
  EXPECT_FALSE(parse_shard("1", &i, &y).is_ok());
}

}  // namespace
}  // namespace afd
