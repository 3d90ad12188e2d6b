// The transport seam's signatures (chorus/transport/transport.hpp): what ranks compare.

#include <gtest/gtest.h>

#include <chorus/transport/transport.hpp>
#include <optional>

namespace chorus::transport {
namespace {

OpSignature signature(OpKind kind, std::size_t send, std::size_t recv, std::uint64_t layout) {
  return OpSignature{kind, DType::Float32, send,  recv, ReduceOp::Kind::Sum,
                     -1,   std::nullopt,   layout};
}

TEST(OpSignature, OfCopiesTheSendBuffersLayout) {
  Buffer send;
  send.count = 4;
  send.layout = 0x1234;
  Buffer recv;
  recv.count = 4;
  recv.layout = 0x5678;
  EXPECT_EQ(OpSignature::of(OpKind::AllReduce, send, recv, ReduceOp::Kind::Sum, -1).layout,
            0x1234U);
}

TEST(OpSignature, DifferentLayoutsOfEqualCountsDisagree) {
  const OpSignature a = signature(OpKind::AllReduce, 6, 6, 1);
  const OpSignature b = signature(OpKind::AllReduce, 6, 6, 2);
  EXPECT_FALSE(a.agrees_with(b));
  EXPECT_TRUE(a.differs_only_in_layout(b));
  EXPECT_TRUE(a.agrees_with(signature(OpKind::AllReduce, 6, 6, 1)));
  EXPECT_FALSE(a.differs_only_in_layout(a));
  // A difference beyond the layout is not "only the layout".
  EXPECT_FALSE(a.differs_only_in_layout(signature(OpKind::AllReduce, 7, 7, 2)));
  // The printed signatures read alike: the layout is not printed.
  EXPECT_EQ(a.to_string(), b.to_string());
  EXPECT_EQ(a.to_string(), "all_reduce(Float32, send=6, recv=6, sum)");
}

TEST(OpSignature, AllToAllComparesTheLayoutButNotTheTotals) {
  EXPECT_TRUE(
      signature(OpKind::AllToAll, 3, 5, 7).agrees_with(signature(OpKind::AllToAll, 4, 1, 7)));
  EXPECT_FALSE(
      signature(OpKind::AllToAll, 3, 5, 7).agrees_with(signature(OpKind::AllToAll, 3, 5, 8)));
  EXPECT_TRUE(signature(OpKind::AllToAll, 3, 5, 7)
                  .differs_only_in_layout(signature(OpKind::AllToAll, 4, 1, 8)));
}

TEST(OpSignature, LayoutTextIsTheLow32BitsInHex) {
  EXPECT_EQ(signature(OpKind::AllReduce, 1, 1, 0).layout_text(), "");
  EXPECT_EQ(signature(OpKind::AllReduce, 1, 1, 0x1234567890abcdefULL).layout_text(), "90abcdef");
  EXPECT_EQ(signature(OpKind::AllReduce, 1, 1, 0x1aULL).layout_text(), "0000001a");
}

TEST(Fingerprint, DiffersOnlyInLayoutWhenEveryOtherFieldAgrees) {
  const Fingerprint a{
      1, 0, {signature(OpKind::AllReduce, 2, 2, 1), signature(OpKind::AllReduce, 4, 4, 1)}};
  const Fingerprint b{
      1, 0, {signature(OpKind::AllReduce, 2, 2, 1), signature(OpKind::AllReduce, 4, 4, 2)}};
  const Fingerprint c{
      1, 0, {signature(OpKind::AllReduce, 3, 3, 1), signature(OpKind::AllReduce, 4, 4, 2)}};
  EXPECT_FALSE(a.same_ops(b));
  EXPECT_TRUE(a.differs_only_in_layout(b));
  EXPECT_FALSE(a.differs_only_in_layout(a));
  EXPECT_FALSE(a.differs_only_in_layout(c));
  EXPECT_EQ(a.to_string(), b.to_string());
}

}  // namespace
}  // namespace chorus::transport
