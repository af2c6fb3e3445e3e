// pdserve gguf inspect|dequantize|quantize: GGUF files as pdserve reads them.
//   inspect FILE                      metadata and tensors as JSON (long arrays summarized)
//   dequantize FILE --out DIR         every tensor (or --tensor NAME) as DIR/NAME.npy, f32, as
//                                     pdserve's kernels see it
//   quantize IN OUT --type q8_0       the F32/F16/BF16 matrices of IN in Q8_0 (llama.cpp's bytes),
//                                     the rest as it is
#include <cstdio>
#include <cstring>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/npy_writer.h"
#include "common/base/file_util.h"
#include "common/base/strings.h"
#include "common/model/gguf.h"
#include "common/model/gguf_writer.h"
#include "kernels/cpu/quant_blocks.h"
#include "nlohmann/json.hpp"

namespace pdserve::cli {
namespace {

using Json = nlohmann::ordered_json;

// A value as JSON; arrays longer than `max_array` as their length and first elements.
Json ValueJson(const GgufValue& v, size_t max_array) {
  switch (v.type) {
    case GgufValueType::kString: return Json(v.s);
    case GgufValueType::kBool: return Json(v.u != 0);
    case GgufValueType::kFloat32:
    case GgufValueType::kFloat64: return Json(v.f);
    case GgufValueType::kArray: {
      Json items = Json::array();
      for (size_t i = 0; i < v.array.size() && i < max_array; ++i) {
        items.push_back(ValueJson(v.array[i], max_array));
      }
      if (v.array.size() <= max_array) return items;
      return Json{{"length", v.array.size()}, {"first", items}};
    }
    default: return v.is_negative ? Json(v.i) : Json(v.u);
  }
}

int Inspect(const std::string& path, int64_t max_array) {
  auto g = GgufFile::Open(path);
  if (!g.ok()) return ReportError("gguf inspect", g.status());
  Json meta = Json::object();
  for (const std::string& key : (*g)->keys()) {
    meta[key] = ValueJson(*(*g)->Find(key), static_cast<size_t>(max_array));
  }
  Json tensors = Json::array();
  for (const GgufTensor& t : (*g)->tensors()) {
    tensors.push_back({{"name", t.name}, {"type", GgmlTypeName(t.type)}, {"dims", t.dims},
                       {"bytes", t.bytes}});
  }
  Json out = {{"version", (*g)->version()}, {"metadata", meta}, {"tensors", tensors}};
  std::printf("%s\n", out.dump(1, ' ', false, Json::error_handler_t::replace).c_str());
  return kExitOk;
}

int Dequantize(const std::string& path, const std::string& out, const std::string& only) {
  const char* cmd = "gguf dequantize";
  auto g = GgufFile::Open(path);
  if (!g.ok()) return ReportError(cmd, g.status());
  if (absl::Status s = MakeDirectories(out); !s.ok()) return ReportError(cmd, s);
  bool found = false;
  for (const GgufTensor& t : (*g)->tensors()) {
    if (!only.empty() && t.name != only) continue;
    found = true;
    std::vector<float> values(static_cast<size_t>(t.elements()));
    kernels::DequantizeRow(t.type, t.data, values.data(), t.elements());
    std::vector<int64_t> shape(t.dims.rbegin(), t.dims.rend());  // NumPy's order: rows first.
    if (absl::Status s = WriteNpyFloat32(JoinPath(out, t.name + ".npy"), values, shape); !s.ok()) {
      return ReportError(cmd, s);
    }
  }
  if (!found) {
    return ReportError(cmd, absl::NotFoundError(Str(path, ": no tensor ", only)), kExitUsage);
  }
  return kExitOk;
}

// Copies IN with its float matrices in Q8_0: every metadata key as it is, tensors in order.
int Quantize(const std::string& in, const std::string& out, const std::string& type) {
  const char* cmd = "gguf quantize";
  if (type != "q8_0") {
    return ReportError(cmd, absl::InvalidArgumentError(Str("--type: '", type, "' (q8_0)")),
                       kExitUsage);
  }
  auto g = GgufFile::Open(in);
  if (!g.ok()) return ReportError(cmd, g.status());
  GgufWriter w;
  uint64_t alignment = 32;
  for (const std::string& key : (*g)->keys()) {
    if (key == "general.alignment") alignment = *(*g)->GetUint(key);
    w.Set(key, *(*g)->Find(key));
  }
  for (const GgufTensor& t : (*g)->tensors()) {
    const bool matrix = t.dims.size() == 2 && !GgmlQuantized(t.type) && t.dims[0] % 32 == 0;
    if (!matrix) {
      w.AddTensor(t.name, t.type, t.dims, std::string(reinterpret_cast<const char*>(t.data), t.bytes));
      continue;
    }
    std::vector<float> values(static_cast<size_t>(t.elements()));
    kernels::DequantizeRow(t.type, t.data, values.data(), t.elements());
    std::string q(static_cast<size_t>(GgmlRowBytes(GgmlType::kQ8_0, t.elements())), '\0');
    kernels::QuantizeRowQ8_0(values.data(), q.data(), t.elements());
    w.AddTensor(t.name, GgmlType::kQ8_0, t.dims, std::move(q));
  }
  if (absl::Status s = w.WriteFile(out, alignment); !s.ok()) return ReportError(cmd, s);
  return kExitOk;
}

}  // namespace

int GgufCommand(int argc, char** argv) {
  const char* cmd = "gguf";
  std::string out, tensor, type = "q8_0";
  int64_t max_array = 16;
  FlagSet flags("gguf inspect|dequantize|quantize FILE [OUT]",
                "GGUF files as pdserve reads them: their metadata and tensors, each tensor "
                "dequantized as the kernels see it, a float file quantized to Q8_0.");
  flags.String("out", &out, "dequantize: the directory for NAME.npy files");
  flags.String("tensor", &tensor, "dequantize: only this tensor");
  flags.String("type", &type, "quantize: the block format (q8_0)");
  flags.Int("max-array", &max_array, "inspect: arrays longer than this are summarized");
  flags.AllowPositional(3);
  int code;
  if (!ParseFlagsOrExit(flags, cmd, argc, argv, &code)) return code;
  const std::vector<std::string>& args = flags.positional();
  const std::string action = args.empty() ? "" : args[0];
  if (action == "inspect" && args.size() == 2) return Inspect(args[1], max_array);
  if (action == "dequantize" && args.size() == 2 && !out.empty()) {
    return Dequantize(args[1], out, tensor);
  }
  if (action == "quantize" && args.size() == 3) return Quantize(args[1], args[2], type);
  return ReportError(cmd,
                     absl::InvalidArgumentError(
                         "usage: pdserve gguf inspect FILE | dequantize FILE --out DIR "
                         "[--tensor NAME] | quantize IN OUT --type q8_0"),
                     kExitUsage);
}

}  // namespace pdserve::cli
