// SeqTable (simulator/src/seq_table.hpp), a communicator's outstanding operations by seq: the
// look-ups std::map answered, against a std::map model, under random inserts and removals
// anywhere in the table (a failed operation leaves from the middle).

#include "seq_table.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "rng.hpp"

namespace chorus::sim::detail {
namespace {

using Table = SeqTable<std::string>;

std::vector<std::pair<std::int64_t, std::string>> contents(const Table& table) {
  std::vector<std::pair<std::int64_t, std::string>> out;
  for (const auto& [seq, value] : table) {
    out.emplace_back(seq, value);
  }
  return out;
}

std::vector<std::pair<std::int64_t, std::string>> contents(
    const std::map<std::int64_t, std::string>& model) {
  return {model.begin(), model.end()};
}

TEST(SeqTable, AnswersAsAMapUnderRandomInsertsAndRemovals) {
  Rng rng(20261207);
  Table table;
  std::map<std::int64_t, std::string> model;
  std::vector<Table::Node> spares;
  for (int step = 0; step < 4000; ++step) {
    const auto seq = static_cast<std::int64_t>(rng.below(12));
    const std::uint64_t action = rng.below(4);
    if (action == 0 && !table.contains(seq)) {
      auto it = table.try_emplace(seq);
      it->second = std::to_string(step);
      model[seq] = std::to_string(step);
    } else if (action == 1 && !table.contains(seq) && !spares.empty()) {
      Table::Node node = std::move(spares.back());
      spares.pop_back();
      node.key() = seq;
      node.mapped() = "spare " + std::to_string(step);
      table.reserve_one();
      const auto it = table.insert(std::move(node));
      EXPECT_EQ(it->first, seq);
      model[seq] = "spare " + std::to_string(step);
    } else if (action == 2 && table.contains(seq)) {
      Table::Node node = table.extract(table.find(seq));
      EXPECT_EQ(node.key(), seq);
      EXPECT_EQ(node.mapped(), model.at(seq));
      spares.push_back(std::move(node));
      model.erase(seq);
    } else if (action == 3 && table.contains(seq)) {
      table.erase(table.find(seq));
      model.erase(seq);
    }
    ASSERT_EQ(contents(table), contents(model)) << "step " << step;
    ASSERT_EQ(table.size(), model.size());
    ASSERT_EQ(table.empty(), model.empty());
    const auto probe = static_cast<std::int64_t>(rng.below(14)) - 1;
    ASSERT_EQ(table.count(probe), model.count(probe));
    const auto lower = table.lower_bound(probe);
    const auto model_lower = model.lower_bound(probe);
    ASSERT_EQ(lower == table.end(), model_lower == model.end());
    if (model_lower != model.end()) {
      ASSERT_EQ(lower->first, model_lower->first);
    }
    const auto upper = table.upper_bound(probe);
    const auto model_upper = model.upper_bound(probe);
    ASSERT_EQ(upper == table.end(), model_upper == model.end());
    if (model_upper != model.end()) {
      ASSERT_EQ(upper->first, model_upper->first);
    }
    if (model.count(probe) != 0) {
      ASSERT_EQ(table.at(probe), model.at(probe));
    }
  }
}

// A node's entry stays where it was made: what a Slot& held across other slots' comings and
// goings reads is still that slot.
TEST(SeqTable, EntriesStayInPlaceAsOthersComeAndGo) {
  Table table;
  std::string* kept = &table.try_emplace(5)->second;
  *kept = "five";
  for (std::int64_t seq = 0; seq < 20; ++seq) {
    if (seq != 5) {
      table.try_emplace(seq)->second = std::to_string(seq);
    }
  }
  for (std::int64_t seq = 0; seq < 5; ++seq) {
    table.erase(table.find(seq));
  }
  EXPECT_EQ(&table.find(5)->second, kept);
  EXPECT_EQ(*kept, "five");
  Table::Node node = table.extract(table.begin());
  EXPECT_EQ(&node.mapped(), kept);
  EXPECT_EQ(table.begin()->first, 6);
}

}  // namespace
}  // namespace chorus::sim::detail
