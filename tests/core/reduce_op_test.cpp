// ReduceOp names, premul_sum, and the dtype rules of DESIGN 2.3 / 2.7.

#include <gtest/gtest.h>

#include <chorus/chorus.hpp>
#include <string>
#include <string_view>

namespace chorus {
namespace {

using Kind = ReduceOp::Kind;

// A ReduceOp of a kind is a constant expression (a literal type): code may keep its reductions
// in constexpr constants, so no member may make the class non-literal. Copies and moves of a
// valid op are constant expressions too (Note [A valid op holds no string]), with every
// compiler: no std::string is made for a valid op.
constexpr ReduceOp kMaxOp = Kind::Max;
static_assert(kMaxOp.kind() == Kind::Max && kMaxOp.is_valid());
constexpr ReduceOp copied_and_moved(ReduceOp op) {
  ReduceOp copy = op;
  ReduceOp moved = std::move(copy);
  ReduceOp assigned = Kind::Sum;
  assigned = moved;
  assigned = std::move(moved);
  return assigned;
}
static_assert(copied_and_moved(kMaxOp).kind() == Kind::Max);

TEST(ReduceOp, NamesAreCaseInsensitiveFromEveryStringType) {
  EXPECT_EQ(ReduceOp("sum").kind(), Kind::Sum);
  EXPECT_EQ(ReduceOp("SUM").kind(), Kind::Sum);
  EXPECT_EQ(ReduceOp(std::string("Avg")).kind(), Kind::Avg);
  EXPECT_EQ(ReduceOp(std::string_view("pRoDuCt")).kind(), Kind::Product);
  EXPECT_EQ(ReduceOp("min").kind(), Kind::Min);
  EXPECT_EQ(ReduceOp("MAX").kind(), Kind::Max);
  EXPECT_EQ(ReduceOp("band").kind(), Kind::BAnd);
  EXPECT_EQ(ReduceOp("BOR").kind(), Kind::BOr);
  EXPECT_EQ(ReduceOp("bxor").kind(), Kind::BXor);
}

TEST(ReduceOp, UnknownNamesAreInvalidAndRejectedWithTheName) {
  const ReduceOp op("summ");
  EXPECT_FALSE(op.is_valid());
  EXPECT_EQ(op.invalid_name(), "summ");
  EXPECT_NE(op.check_dtype(DType::Float32).find("Unrecognized reduce_op 'summ'"),
            std::string::npos);
  EXPECT_THROW(ReduceOp::parse("summ"), InvalidArgument);
  EXPECT_EQ(ReduceOp::parse("Max").kind(), Kind::Max);
  EXPECT_NE(ReduceOp("premul_sum").check_dtype(DType::Float32).find("ReduceOp::premul_sum(f)"),
            std::string::npos);
  EXPECT_FALSE(ReduceOp("").is_valid());
}

// parse refuses every name the constructor does not know, the empty one included, with the same
// text the collectives give.
TEST(ReduceOp, ParseRefusesTheEmptyName) {
  try {
    (void)ReduceOp::parse("");
    ADD_FAILURE() << "ReduceOp::parse accepted the empty name";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what())
                  .find("Unrecognized reduce_op '': expected one of sum, avg, product, min, max, "
                        "band, bor, bxor"),
              std::string::npos)
        << error.what();
  }
}

// A null name is the empty name: invalid, named "", never a default op.
TEST(ReduceOp, ANullNameIsInvalidAndEmpty) {
  const ReduceOp op(static_cast<const char*>(nullptr));
  EXPECT_FALSE(op.is_valid());
  EXPECT_EQ(op.kind(), Kind::Invalid);
  EXPECT_EQ(op.invalid_name(), "");
  EXPECT_EQ(op, ReduceOp(""));
}

// premul_sum's hint reads the name case-insensitively, as the names themselves are read.
TEST(ReduceOp, PremulSumHintIgnoresCase) {
  for (const char* name : {"premul_sum", "PREMUL_SUM", "Premul_Sum"}) {
    const std::string reason = ReduceOp(name).check_dtype(DType::Float32);
    EXPECT_NE(reason.find("Unrecognized reduce_op '" + std::string(name) + "'"), std::string::npos)
        << reason;
    EXPECT_NE(reason.find("(premul_sum needs a factor: use ReduceOp::premul_sum(f))"),
              std::string::npos)
        << reason;
  }
}

TEST(ReduceOp, AKindOutsideTheEnumeratorsIsInvalidAndNamed) {
  // A cast from a bad integer is refused like an unknown name, not passed to a kernel.
  const ReduceOp op(static_cast<Kind>(42));
  EXPECT_FALSE(op.is_valid());
  EXPECT_EQ(op.invalid_name(), "ReduceOp::Kind(42)");
  EXPECT_EQ(op.to_string(), "'ReduceOp::Kind(42)'");
  EXPECT_EQ(op.check_dtype(DType::Int32),
            "Unrecognized reduce_op 'ReduceOp::Kind(42)': expected one of sum, avg, product, min, "
            "max, band, bor, bxor");
  EXPECT_FALSE(ReduceOp(Kind::Invalid).is_valid());
  EXPECT_EQ(ReduceOp(Kind::Invalid).invalid_name(), "");
  EXPECT_TRUE(ReduceOp(Kind::PremulSum).is_valid());
  EXPECT_EQ(ReduceOp(Kind::Sum).invalid_name(), "");
}

// An invalid op keeps its name through copies, moves and assignments (Note [A valid op holds no
// string]), and ops compare by name: the same name alike, different ones not, the empty
// name like a Kind::Invalid op without one.
TEST(ReduceOp, AnInvalidOpKeepsItsNameThroughCopiesAndMoves) {
  const ReduceOp summ("summ");
  EXPECT_EQ(summ, ReduceOp(std::string("summ")));
  EXPECT_NE(summ, ReduceOp("sunm"));
  EXPECT_NE(summ, ReduceOp(""));
  EXPECT_NE(summ, ReduceOp(Kind::Invalid));
  EXPECT_NE(summ, ReduceOp(Kind::Sum));
  EXPECT_EQ(ReduceOp(""), ReduceOp(Kind::Invalid));
  EXPECT_EQ(ReduceOp("SUMM"), ReduceOp("SUMM"));
  EXPECT_NE(ReduceOp("SUMM"), summ);  // the name as given, not lowered

  ReduceOp copy = summ;
  EXPECT_EQ(copy.invalid_name(), "summ");
  ReduceOp moved = std::move(copy);
  EXPECT_EQ(moved.invalid_name(), "summ");
  EXPECT_EQ(moved, summ);
  ReduceOp assigned = Kind::Max;
  assigned = summ;
  EXPECT_EQ(assigned.invalid_name(), "summ");
  assigned = ReduceOp("other");
  EXPECT_EQ(assigned.invalid_name(), "other");
  const ReduceOp& itself = assigned;
  assigned = itself;  // a self-assignment keeps the name
  EXPECT_EQ(assigned.invalid_name(), "other");
  assigned = Kind::Avg;
  EXPECT_TRUE(assigned.is_valid());
  EXPECT_EQ(assigned.invalid_name(), "");
  EXPECT_EQ(assigned, ReduceOp("avg"));
  moved = ReduceOp::premul_sum(0.5);
  EXPECT_EQ(moved, ReduceOp::premul_sum(0.5));
  EXPECT_EQ(moved.invalid_name(), "");
  EXPECT_EQ(ReduceOp(summ).check_dtype(DType::Float32),
            "Unrecognized reduce_op 'summ': expected one of sum, avg, product, min, max, band, "
            "bor, bxor");
}

TEST(ReduceOp, PremulSumCarriesItsFactor) {
  const ReduceOp op = ReduceOp::premul_sum(0.25);
  EXPECT_EQ(op.kind(), Kind::PremulSum);
  EXPECT_EQ(op.premul_factor(), 0.25);
  EXPECT_EQ(op.to_string(), "premul_sum(0.25)");
  EXPECT_EQ(ReduceOp("sum").premul_factor(), 1.0);
  EXPECT_NE(ReduceOp::premul_sum(0.5), ReduceOp::premul_sum(2.0));
  EXPECT_EQ(ReduceOp::premul_sum(0.5), ReduceOp::premul_sum(0.5));
}

// Mismatch reports print both ranks' ops: factors that differ must print differently (six
// significant digits printed these two alike), and each prints the shortest text that reads back.
TEST(ReduceOp, PremulSumPrintsItsFactorExactly) {
  EXPECT_EQ(ReduceOp::premul_sum(1.0 / 3).to_string(), "premul_sum(0.3333333333333333)");
  EXPECT_EQ(ReduceOp::premul_sum(0.3333333).to_string(), "premul_sum(0.3333333)");
  EXPECT_EQ(ReduceOp::premul_sum(0.1).to_string(), "premul_sum(0.1)");
  EXPECT_EQ(ReduceOp::premul_sum(2.0).to_string(), "premul_sum(2)");
  EXPECT_EQ(ReduceOp::premul_sum(1e-300).to_string(), "premul_sum(1e-300)");
}

// Which (op, dtype) pairs are allowed: the table of DESIGN 2.3 / 2.7.
bool allowed(Kind kind, DType dtype) {
  const bool bitwise = kind == Kind::BAnd || kind == Kind::BOr || kind == Kind::BXor;
  if (dtype == DType::Bool) {
    return bitwise || kind == Kind::Min || kind == Kind::Max;
  }
  if (is_complex(dtype)) {
    return kind == Kind::Sum || kind == Kind::Avg || kind == Kind::PremulSum;
  }
  if (is_floating(dtype)) {
    return !bitwise;
  }
  return kind != Kind::PremulSum;  // integers
}

TEST(ReduceOp, DtypeRulesMatchTheDesignTable) {
  const Kind kinds[] = {Kind::Sum,  Kind::Avg, Kind::Product, Kind::Min,      Kind::Max,
                        Kind::BAnd, Kind::BOr, Kind::BXor,    Kind::PremulSum};
  for (Kind kind : kinds) {
    const ReduceOp op = kind == Kind::PremulSum ? ReduceOp::premul_sum(2.0) : ReduceOp(kind);
    for (DType dtype : kAllDTypes) {
      const std::string reason = op.check_dtype(dtype);
      EXPECT_EQ(reason.empty(), allowed(kind, dtype))
          << op.to_string() << " on " << dtype_name(dtype) << ": " << reason;
      if (!reason.empty()) {
        EXPECT_NE(reason.find(std::string(dtype_name(dtype))), std::string::npos) << reason;
      }
    }
  }
}

TEST(ReduceOp, NamesPrint) {
  EXPECT_EQ(ReduceOp(Kind::BXor).to_string(), "bxor");
  EXPECT_EQ(ReduceOp("nope").to_string(), "'nope'");
  EXPECT_EQ(reduce_kind_name(Kind::Avg), "avg");
}

}  // namespace
}  // namespace chorus
