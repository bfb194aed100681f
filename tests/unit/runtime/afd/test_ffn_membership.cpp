// FfnMembershipPolicy (runtime/afd/ffn_membership.h): the attention side's FFN membership
// decisions, driven without a transport or a clock. Reach values stand for what the
// transport and the probes would say; times are plain numbers.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/afd/ffn_membership.h"

namespace afd::test_ffn_membership {
namespace {

constexpr int64_t kMs = 1000000;
constexpr int64_t kExperts = 8;
constexpr int kTakeoverMs = 100;

const Reach kUp{true, false};
const Reach kGone{false, false};
const Reach kSilent{true, true};  // connected, a probe overdue

// n members "ffn<j>" at "addr<j>" started with their shard j of n (epoch 0), P parts.
FfnMembershipPolicy started(int n, int parts, int takeover_ms = kTakeoverMs) {
  FfnMembershipPolicy p(kExperts, parts, takeover_ms);
  for (int j = 0; j < n; ++j) {
    p.add_started("ffn" + std::to_string(j), "addr" + std::to_string(j), 0);
    p.members().back().share.range = ExpertRange{j * kExperts / n, (j + 1) * kExperts / n, j == 0, 0, 1};
  }
  return p;
}

std::vector<bool> assigned(const FfnMembershipPolicy& p) {
  std::vector<bool> a;
  for (const FfnMemberState& m : p.members()) a.push_back(m.assigned);
  return a;
}

TEST(FfnMembership, PartShareSplitsPartsContiguously) {
  // 3 members over 4 parts of 8 experts: parts [0,1), [1,2), [2,4).
  const FfnShare a = part_share(0, 3, 4, 8), b = part_share(1, 3, 4, 8), c = part_share(2, 3, 4, 8);
  EXPECT_EQ(a.part_begin, 0);
  EXPECT_EQ(a.part_end, 1);
  EXPECT_EQ(a.range.begin, 0);
  EXPECT_EQ(a.range.end, 2);
  EXPECT_TRUE(a.range.holds_shared);
  EXPECT_EQ(b.part_begin, 1);
  EXPECT_EQ(b.range.begin, 2);
  EXPECT_EQ(b.range.end, 4);
  EXPECT_FALSE(b.range.holds_shared);
  EXPECT_EQ(c.part_begin, 2);
  EXPECT_EQ(c.part_end, 4);
  EXPECT_EQ(c.range.begin, 4);
  EXPECT_EQ(c.range.end, 8);
  EXPECT_EQ(c.range.tp_degree, 1);
}

TEST(FfnMembership, AllReachableChangesNothing) {
  auto p = started(2, 2);
  const std::vector<Reach> up{kUp, kUp};
  for (int64_t t : {0L, 1000 * kMs}) EXPECT_TRUE(p.evaluate(up, t).why.empty());
  EXPECT_EQ(p.epoch(), 0u);
  EXPECT_EQ(assigned(p), (std::vector<bool>{true, true}));
}

TEST(FfnMembership, UnreachableForTheTakeoverTimeIsTakenOver) {
  auto p = started(2, 2);
  const std::vector<Reach> down1{kUp, kGone};
  const int64_t t0 = 5 * kMs;
  EXPECT_TRUE(p.evaluate(down1, t0).why.empty());
  EXPECT_EQ(p.members()[1].down_since, t0);
  EXPECT_EQ(p.members()[1].down_why, "not connected");
  EXPECT_TRUE(p.evaluate(down1, t0 + (kTakeoverMs - 1) * kMs).why.empty());
  EXPECT_EQ(p.epoch(), 0u);

  const auto v = p.evaluate(down1, t0 + kTakeoverMs * kMs);
  EXPECT_NE(v.why.find("FFN worker 'ffn1' unreachable for 100 ms (not connected)"), std::string::npos) << v.why;
  EXPECT_EQ(p.epoch(), 1u);
  EXPECT_EQ(p.takeovers(), 1);
  EXPECT_EQ(assigned(p), (std::vector<bool>{true, false}));
  // The survivor holds both parts: every expert and the shared part.
  const FfnShare& s = p.members()[0].share;
  EXPECT_EQ(s.part_begin, 0);
  EXPECT_EQ(s.part_end, 2);
  EXPECT_EQ(s.range.begin, 0);
  EXPECT_EQ(s.range.end, kExperts);
  EXPECT_TRUE(s.range.holds_shared);
  EXPECT_EQ(p.describe_assignment(), "'ffn0' [0, 8) + shared/dense");
}

TEST(FfnMembership, AnOverdueProbeCountsAsUnreachable) {
  auto p = started(2, 2);
  const std::vector<Reach> silent1{kUp, kSilent};
  p.evaluate(silent1, kMs);
  EXPECT_EQ(p.members()[1].down_why, "no answer to a liveness probe");
  p.evaluate(silent1, kMs + kTakeoverMs * kMs);
  EXPECT_EQ(p.epoch(), 1u);
  EXPECT_FALSE(p.members()[1].assigned);
}

TEST(FfnMembership, NoTakeoverWithoutAReachableSurvivorOrTakeoverTime) {
  auto p = started(2, 2);
  const std::vector<Reach> none{kGone, kGone};
  p.evaluate(none, kMs);
  p.evaluate(none, 10 * kTakeoverMs * kMs);
  EXPECT_EQ(p.epoch(), 0u);
  EXPECT_EQ(assigned(p), (std::vector<bool>{true, true}));

  auto never = started(2, 2, /*takeover_ms=*/0);
  const std::vector<Reach> down1{kUp, kGone};
  never.evaluate(down1, kMs);
  never.evaluate(down1, 1000000 * kMs);
  EXPECT_EQ(never.epoch(), 0u);
  EXPECT_TRUE(never.members()[1].assigned);
}

TEST(FfnMembership, BackAfterATakeoverItRejoinsAndTheExpertsAreRebalanced) {
  auto p = started(2, 2);
  p.evaluate(std::vector<Reach>{kUp, kGone}, kMs);
  p.evaluate(std::vector<Reach>{kUp, kGone}, kMs + kTakeoverMs * kMs);
  ASSERT_EQ(p.epoch(), 1u);
  const auto v = p.evaluate(std::vector<Reach>{kUp, kUp}, 2 * kTakeoverMs * kMs);
  EXPECT_NE(v.why.find("'ffn1' (addr1) is reachable: it joins the assignment"), std::string::npos) << v.why;
  EXPECT_EQ(p.epoch(), 2u);
  EXPECT_EQ(assigned(p), (std::vector<bool>{true, true}));
  EXPECT_EQ(p.members()[1].down_since, 0);
  EXPECT_EQ(p.members()[1].share.part_begin, 1);
  EXPECT_EQ(p.members()[1].share.range.begin, kExperts / 2);
  const FfnMembership snap = p.snapshot({true, true}, 2, 3 * kTakeoverMs * kMs);
  EXPECT_EQ(snap.takeovers, 1);
  EXPECT_EQ(snap.rejoins, 1);
  EXPECT_EQ(snap.assigned, 2);
}

TEST(FfnMembership, BeyondThePartsAMemberIsAStandbyThatJoinsWhenOneLeaves) {
  auto p = started(3, 2);
  EXPECT_EQ(p.fit_to_parts(), (std::vector<std::string>{"ffn2"}));
  p.reassign();
  EXPECT_EQ(p.epoch(), 1u);
  EXPECT_EQ(assigned(p), (std::vector<bool>{true, true, false}));
  // Reachable, but P members are assigned already: it stays a standby.
  EXPECT_TRUE(p.evaluate(std::vector<Reach>{kUp, kUp, kUp}, 0).why.empty());

  // ffn0 is removed: it leaves, the standby joins, a new epoch over ffn1 and ffn2.
  auto ch = p.apply_list(std::vector<FfnMember>{{"addr1", "ffn1"}, {"addr2", "ffn2"}}, false, 0);
  ASSERT_TRUE(ch.ok()) << ch.status().to_string();
  EXPECT_EQ(ch->undial, (std::vector<std::string>{"addr0"}));
  EXPECT_TRUE(ch->dial.empty());
  const auto v = p.evaluate(std::vector<Reach>{kUp, kUp, kUp}, kMs);
  EXPECT_NE(v.why.find("'ffn0' (addr0) left the membership"), std::string::npos) << v.why;
  EXPECT_EQ(p.epoch(), 2u);
  EXPECT_EQ(assigned(p), (std::vector<bool>{false, true, true}));
  EXPECT_TRUE(p.members()[1].share.range.holds_shared);
  EXPECT_EQ(p.snapshot({true, true, true}, 2, kMs).leaves, 1);
}

TEST(FfnMembership, ARefusalLeavesUntilANewConnection) {
  auto p = started(2, 2);
  p.reassign();  // epoch 1: the engine thread's hello to ffn1 is refused
  FfnMemberState& m1 = p.members()[1];
  m1.refused_gen = m1.conn_gen + 1;
  const std::vector<Reach> up{kUp, kUp};
  const auto v = p.evaluate(up, 0);
  EXPECT_NE(v.why.find("'ffn1' refused its assignment"), std::string::npos) << v.why;
  EXPECT_FALSE(p.members()[1].assigned);
  EXPECT_EQ(p.epoch(), 2u);
  EXPECT_TRUE(p.evaluate(up, kMs).why.empty());  // reachable, but it refused on this connection
  ++p.members()[1].conn_gen;                     // it reconnected
  EXPECT_FALSE(p.evaluate(up, 2 * kMs).why.empty());
  EXPECT_TRUE(p.members()[1].assigned);
}

TEST(FfnMembership, AMemberBeingCheckedDoesNotJoin) {
  auto p = started(1, 2);
  auto ch = p.apply_list(std::vector<FfnMember>{{"addr0", "ffn0"}, {"addr9", ""}}, true, 0);
  ASSERT_TRUE(ch.ok());
  EXPECT_EQ(ch->created, (std::vector<size_t>{1}));
  EXPECT_EQ(ch->check, (std::vector<size_t>{1}));
  EXPECT_EQ(ch->dial, (std::vector<std::string>{"addr9"}));
  p.members()[1].name = "ffn9";  // its connection named it
  EXPECT_TRUE(p.evaluate(std::vector<Reach>{kUp, kUp}, 0).why.empty());
  p.members()[1].checking = false;
  EXPECT_FALSE(p.evaluate(std::vector<Reach>{kUp, kUp}, kMs).why.empty());
  EXPECT_EQ(assigned(p), (std::vector<bool>{true, true}));
}

TEST(FfnMembership, TpSlicesNeverMoveAndAreReportedOnce) {
  auto p = started(2, 2);
  p.set_tp_slices();
  const std::vector<Reach> down1{kUp, kGone};
  p.evaluate(down1, kMs);
  const auto v = p.evaluate(down1, kMs + kTakeoverMs * kMs);
  EXPECT_TRUE(v.why.empty());
  EXPECT_EQ(v.tp_stuck_name, "ffn1");
  EXPECT_EQ(v.tp_stuck_ms, kTakeoverMs);
  EXPECT_TRUE(p.evaluate(down1, 2 * kTakeoverMs * kMs).tp_stuck_name.empty());
  EXPECT_EQ(p.epoch(), 0u);
  EXPECT_EQ(p.takeover_in_ms(1, {true, false}, 0), -1);
  auto ch = p.apply_list(std::vector<FfnMember>{{"addr0", "ffn0"}}, false, 0);
  EXPECT_EQ(ch.status().code(), StatusCode::not_supported);
}

TEST(FfnMembership, TakeoverInSaysWhenTheOthersTakeOver) {
  auto p = started(2, 2);
  p.evaluate(std::vector<Reach>{kUp, kGone}, 10 * kMs);
  EXPECT_EQ(p.takeover_in_ms(1, {true, false}, 40 * kMs), kTakeoverMs - 30);
  EXPECT_EQ(p.takeover_in_ms(1, {true, false}, 500 * kMs), 0);
  EXPECT_EQ(p.takeover_in_ms(1, {false, false}, 40 * kMs), -1);  // nobody to take over
  auto never = started(2, 2, 0);
  EXPECT_EQ(never.takeover_in_ms(1, {true, false}, 0), -1);
}

TEST(FfnMembership, StartWithoutTheMissingCountsTakeovers) {
  auto p = started(3, 3);
  EXPECT_EQ(p.start_without({true, false, false}, 7), "'ffn1', 'ffn2'");
  EXPECT_EQ(p.takeovers(), 2);
  EXPECT_EQ(p.members()[2].down_since, 7);
  p.reassign();
  EXPECT_EQ(p.members()[0].share.part_end, 3);
  // Once they connect they join (P = 3).
  p.evaluate(std::vector<Reach>{kUp, kUp, kUp}, 8);
  EXPECT_EQ(assigned(p), (std::vector<bool>{true, true, true}));
  EXPECT_EQ(p.members()[2].share.part_begin, 2);
}

TEST(FfnMembership, ApplyListRefusesBadLists) {
  auto p = started(2, 2);
  auto code = [&](std::vector<FfnMember> l) { return p.apply_list(l, false, 0).status().code(); };
  EXPECT_EQ(code({}), StatusCode::invalid_argument);
  EXPECT_EQ(code({{"", "x"}}), StatusCode::invalid_argument);
  EXPECT_EQ(code({{"a", ""}, {"a", ""}}), StatusCode::invalid_argument);
  EXPECT_EQ(code({{"a", "n"}, {"b", "n"}}), StatusCode::invalid_argument);
  // addr0 is ffn0, not ffn5.
  EXPECT_EQ(code({{"addr0", "ffn5"}}), StatusCode::invalid_argument);
  // ffn1 belongs to addr1, which stays.
  EXPECT_EQ(code({{"addr1", ""}, {"new", "ffn1"}}), StatusCode::invalid_argument);
  // Nothing changed.
  EXPECT_EQ(p.members().size(), 2u);
  EXPECT_TRUE(p.members()[0].active && p.members()[1].active);
  // At most kMaxSlots slots over the lifetime.
  std::vector<FfnMember> many;
  for (size_t i = 0; i < FfnMembershipPolicy::kMaxSlots - 1; ++i) many.push_back({"m" + std::to_string(i), ""});
  EXPECT_EQ(code(many), StatusCode::invalid_argument);
}

TEST(FfnMembership, ApplyListKeepsSlotsAndReactivates) {
  auto p = started(2, 2);
  auto ch = p.apply_list(std::vector<FfnMember>{{"addr0", "ffn0"}}, true, 0);
  ASSERT_TRUE(ch.ok());
  EXPECT_FALSE(p.members()[1].active);
  EXPECT_EQ(ch->notes, (std::vector<std::string>{"FFN worker 'ffn1' (addr1) removed from the membership"}));
  p.evaluate(std::vector<Reach>{kUp, kUp}, 0);  // ffn1 leaves the assignment
  ASSERT_FALSE(p.members()[1].assigned);
  // Listed again: the same slot, dialled again, checked before it joins.
  ch = p.apply_list(std::vector<FfnMember>{{"addr0", "ffn0"}, {"addr1", "ffn1"}}, true, 5);
  ASSERT_TRUE(ch.ok());
  EXPECT_EQ(p.members().size(), 2u);
  EXPECT_TRUE(p.members()[1].active);
  EXPECT_EQ(p.members()[1].added_ns, 5);
  EXPECT_EQ(ch->dial, (std::vector<std::string>{"addr1"}));
  EXPECT_EQ(ch->check, (std::vector<size_t>{1}));
  EXPECT_TRUE(ch->created.empty());
  p.withdraw("addr1");
  EXPECT_FALSE(p.members()[1].active);
}

TEST(FfnMembership, SnapshotReportsTheAssignment) {
  auto p = started(2, 2);
  p.evaluate(std::vector<Reach>{kUp, kGone}, kMs);
  const FfnMembership s = p.snapshot({true, false}, 0, 31 * kMs);
  EXPECT_EQ(s.epoch, 0u);
  EXPECT_EQ(s.parts, 2);
  EXPECT_TRUE(s.whole_experts);
  ASSERT_EQ(s.members.size(), 2u);
  EXPECT_TRUE(s.members[0].connected);
  EXPECT_EQ(s.members[0].expert_end, kExperts / 2);
  EXPECT_TRUE(s.members[0].holds_shared);
  EXPECT_FALSE(s.members[1].connected);
  EXPECT_EQ(s.members[1].unreachable_ms, 30);
  EXPECT_EQ(s.members[1].expert_begin, kExperts / 2);
}

}  // namespace
}  // namespace afd::test_ffn_membership
