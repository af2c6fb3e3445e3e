#include "common/rpc/sampling_proto.h"

namespace pdserve {

SamplingParams FromProto(const v1::SamplingParams& p, std::optional<uint64_t> seed) {
  SamplingParams s;
  if (p.has_temperature()) s.temperature = p.temperature();
  if (p.has_top_p()) s.top_p = p.top_p();
  s.top_k = p.top_k();
  s.min_p = p.min_p();
  if (p.has_repetition_penalty()) s.repetition_penalty = p.repetition_penalty();
  s.frequency_penalty = p.frequency_penalty();
  s.presence_penalty = p.presence_penalty();
  if (seed) {
    s.seed = *seed;
  } else if (p.has_seed()) {
    s.seed = p.seed();
  }
  if (p.has_max_tokens()) s.max_tokens = p.max_tokens();
  s.stop_token_ids.assign(p.stop_token_ids().begin(), p.stop_token_ids().end());
  s.ignore_eos = p.ignore_eos();
  s.logprobs = p.logprobs();
  if (p.has_num_speculative_tokens()) s.num_speculative_tokens = p.num_speculative_tokens();
  if (p.has_constraint()) s.constraint = FromProto(p.constraint());
  s.lora_name = p.lora_name();
  return s;
}

std::shared_ptr<const structured::OutputConstraint> FromProto(const v1::Constraint& c) {
  using Kind = structured::OutputConstraint::Kind;
  auto out = std::make_shared<structured::OutputConstraint>();
  switch (c.kind_case()) {
    case v1::Constraint::kJsonSchema:
      out->kind = Kind::kJsonSchema;
      out->value = c.json_schema();
      break;
    case v1::Constraint::kJsonObject:
      if (!c.json_object()) return nullptr;
      out->kind = Kind::kJsonObject;
      break;
    case v1::Constraint::kRegex:
      out->kind = Kind::kRegex;
      out->value = c.regex();
      break;
    case v1::Constraint::kChoice:
      out->kind = Kind::kChoice;
      out->choices.assign(c.choice().choices().begin(), c.choice().choices().end());
      break;
    case v1::Constraint::kGrammar:
      out->kind = Kind::kGrammar;
      out->value = c.grammar();
      break;
    default:
      return nullptr;
  }
  out->whitespace = c.json_whitespace();
  return out;
}

void ToProto(const structured::OutputConstraint& c, v1::Constraint* out) {
  using Kind = structured::OutputConstraint::Kind;
  switch (c.kind) {
    case Kind::kJsonSchema: out->set_json_schema(c.value); break;
    case Kind::kJsonObject: out->set_json_object(true); break;
    case Kind::kRegex: out->set_regex(c.value); break;
    case Kind::kChoice:
      for (const std::string& choice : c.choices) out->mutable_choice()->add_choices(choice);
      break;
    case Kind::kGrammar: out->set_grammar(c.value); break;
  }
  if (!c.whitespace.empty()) out->set_json_whitespace(c.whitespace);
}

}  // namespace pdserve
