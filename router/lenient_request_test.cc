#include "router/lenient_request.h"

#include <google/protobuf/descriptor.h>

#include "gtest/gtest.h"
#include "pdserve/internal/v1/lenient.pb.h"

namespace pdserve {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

// Same numbers, names, labels and types, except string -> bytes; nested messages alike.
void ExpectMirror(const Descriptor* strict, const Descriptor* lenient) {
  ASSERT_EQ(strict->field_count(), lenient->field_count()) << strict->full_name();
  for (int i = 0; i < strict->field_count(); ++i) {
    const FieldDescriptor* a = strict->field(i);
    const FieldDescriptor* b = lenient->FindFieldByNumber(a->number());
    ASSERT_NE(b, nullptr) << a->full_name();
    EXPECT_EQ(a->name(), b->name());
    EXPECT_EQ(a->is_repeated(), b->is_repeated()) << a->full_name();
    EXPECT_EQ(a->has_presence(), b->has_presence()) << a->full_name();
    EXPECT_EQ(a->containing_oneof() != nullptr, b->containing_oneof() != nullptr) << a->full_name();
    if (a->type() == FieldDescriptor::TYPE_STRING) {
      EXPECT_EQ(b->type(), FieldDescriptor::TYPE_BYTES) << a->full_name();
    } else {
      EXPECT_EQ(a->type(), b->type()) << a->full_name();
    }
    if (a->type() == FieldDescriptor::TYPE_MESSAGE && a->message_type() != b->message_type()) {
      ExpectMirror(a->message_type(), b->message_type());
    }
  }
}

TEST(LenientRequestTest, MirrorsThePublicMessages) {
  ExpectMirror(v1::GenerateRequest::descriptor(), internal::v1::LenientGenerateRequest::descriptor());
  ExpectMirror(v1::TokenizeRequest::descriptor(), internal::v1::LenientTokenizeRequest::descriptor());
  ExpectMirror(v1::GenerateResponse::descriptor(), internal::v1::LenientGenerateResponse::descriptor());
}

TEST(LenientRequestTest, RoundTripsAValidRequest) {
  v1::GenerateRequest r;
  r.set_request_id("abc");
  r.set_text("héllo");
  r.mutable_sampling()->set_temperature(0.5f);
  r.mutable_sampling()->add_stop("\n\n");
  r.mutable_sampling()->set_max_tokens(7);
  auto parsed = ParseGenerateRequest(r.SerializeAsString());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->SerializeAsString(), r.SerializeAsString());
}

TEST(LenientRequestTest, InvalidUtf8NamesTheField) {
  internal::v1::LenientGenerateRequest bad;
  bad.set_text("ok\xff");
  auto a = ParseGenerateRequest(bad.SerializeAsString());
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("prompt.text"), absl::string_view::npos);
  internal::v1::LenientGenerateRequest stop;
  stop.set_text("fine");
  stop.mutable_sampling()->add_stop(std::string(1, static_cast<char>(0xc3)));
  EXPECT_NE(ParseGenerateRequest(stop.SerializeAsString()).status().message().find("sampling.stop"),
            absl::string_view::npos);
  EXPECT_FALSE(ParseGenerateRequest("\xff\xff\xff").ok());
}

}  // namespace
}  // namespace pdserve
