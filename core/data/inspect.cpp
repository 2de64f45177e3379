// Text of one sample (inspect.hpp).
#include "core/data/inspect.hpp"

#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <span>
#include <sstream>
#include <stdexcept>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/data/tokenizer.hpp"

namespace tandem::data {
namespace {

constexpr std::int32_t kBytes = 256;  // byte-tokenizer ids below this are UTF-8 bytes (SPEC 12)

std::string hex_escape(unsigned char byte) {
  char text[5];
  std::snprintf(text, sizeof text, "\\x%02x", static_cast<unsigned>(byte));
  return text;
}

// One byte inside a quoted text: printable ASCII as itself, the usual escapes, \xNN otherwise.
std::string escape_byte(unsigned char byte, char quote) {
  switch (byte) {
    case '\n': return "\\n";
    case '\t': return "\\t";
    case '\r': return "\\r";
    case '\\': return "\\\\";
    default: break;
  }
  if (byte == static_cast<unsigned char>(quote)) return std::string("\\") + quote;
  if (byte >= 0x20 && byte < 0x7f) return std::string(1, static_cast<char>(byte));
  return hex_escape(byte);
}

// The bytes of `text` as unsigned values, without a copy.
std::span<const unsigned char> unsigned_bytes(const std::string& text) {
  return {reinterpret_cast<const unsigned char*>(text.data()), text.size()};
}

// Length of the well-formed UTF-8 sequence starting at bytes[i] (RFC 3629: no overlongs, no
// surrogates, at most U+10FFFF); 0 when there is none, e.g. a character cut by the window's edge.
std::size_t utf8_sequence_length(std::span<const unsigned char> bytes, std::size_t i) {
  const unsigned char lead = bytes[i];
  std::size_t length = 0;
  unsigned char low = 0x80, high = 0xbf;  // the allowed range of the second byte
  if (lead >= 0xc2 && lead <= 0xdf) length = 2;
  else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
    if (lead == 0xe0) low = 0xa0;
    if (lead == 0xed) high = 0x9f;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
    if (lead == 0xf0) low = 0x90;
    if (lead == 0xf4) high = 0x8f;
  } else {
    return 0;
  }
  if (i + length > bytes.size()) return 0;
  if (bytes[i + 1] < low || bytes[i + 1] > high) return 0;
  for (std::size_t k = 2; k < length; ++k) {
    if (bytes[i + k] < 0x80 || bytes[i + k] > 0xbf) return 0;
  }
  return length;
}

// Bytes quoted with `quote`: well-formed UTF-8 characters as themselves, other bytes escaped.
std::string quote_bytes(const std::string& bytes, char quote) {
  const std::span<const unsigned char> data = unsigned_bytes(bytes);
  std::string text(1, quote);
  for (std::size_t i = 0; i < data.size();) {
    if (data[i] >= 0x80) {
      if (const std::size_t length = utf8_sequence_length(data, i); length > 0) {
        text.append(bytes, i, length);
        i += length;
        continue;
      }
    }
    text += escape_byte(data[i], quote);
    ++i;
  }
  return text + quote;
}

// The code points of well-formed UTF-8 `text` (a JSON key); nullopt when it is not.
std::optional<std::vector<char32_t>> code_points(const std::string& text) {
  // A view, not a copy: GCC 12 under -fsanitize=thread took a vector copy's delete for a bad free
  // (-Wfree-nonheap-object).
  const std::span<const unsigned char> data = unsigned_bytes(text);
  std::vector<char32_t> out;
  for (std::size_t i = 0; i < data.size();) {
    if (data[i] < 0x80) {
      out.push_back(data[i++]);
      continue;
    }
    const std::size_t length = utf8_sequence_length(data, i);
    if (length == 0) return std::nullopt;
    char32_t point = data[i] & (0xff >> (length + 1));
    for (std::size_t k = 1; k < length; ++k) point = (point << 6) | (data[i + k] & 0x3f);
    out.push_back(point);
    i += length;
  }
  return out;
}

// GPT-2's byte-level alphabet (its bytes_to_unicode): the bytes '!'..'~', 0xa1..0xac and
// 0xae..0xff are written as the characters of the same number; the other 68 bytes, in increasing
// order, as U+0100, U+0101, ... A vocabulary key is the characters of its token's bytes.
std::map<char32_t, unsigned char> byte_level_alphabet() {
  std::map<char32_t, unsigned char> byte_of;
  char32_t next = 0x100;
  for (unsigned byte = 0; byte < 256; ++byte) {
    const bool itself = (byte >= '!' && byte <= '~') || (byte >= 0xa1 && byte <= 0xac) || byte >= 0xae;
    byte_of[itself ? static_cast<char32_t>(byte) : next++] = static_cast<unsigned char>(byte);
  }
  return byte_of;
}

// The bytes a byte-level vocabulary key stands for; the key itself when one of its characters is
// outside the alphabet (an added token such as "<|endoftext|>" is plain ASCII either way).
std::string key_bytes(const std::string& key, const std::map<char32_t, unsigned char>& byte_of) {
  const auto points = code_points(key);
  if (!points) return key;
  std::string bytes;
  for (const char32_t point : *points) {
    const auto found = byte_of.find(point);
    if (found == byte_of.end()) return key;
    bytes += static_cast<char>(found->second);
  }
  return bytes;
}

nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  return nlohmann::json::parse(in);
}

// Token id -> the bytes it stands for, when tandem can decode `tokenizer`; empty otherwise, with
// `how` saying which. The files were read and checked once already (read_tokenizer_ids).
std::vector<std::string> token_bytes(const TokenizerConfig& tokenizer, std::string& how) {
  std::vector<std::string> pieces;
  auto place = [&pieces](std::int64_t id, std::string bytes) {
    if (id < 0) return;
    if (static_cast<std::size_t>(id) >= pieces.size()) pieces.resize(static_cast<std::size_t>(id) + 1);
    pieces[static_cast<std::size_t>(id)] = std::move(bytes);
  };
  switch (tokenizer.type) {
    case TokenizerType::bytes:
      for (int byte = 0; byte < kBytes; ++byte) place(byte, std::string(1, static_cast<char>(byte)));
      how = "ids below 256 are UTF-8 bytes, shown as text";
      return pieces;
    case TokenizerType::gpt2_bpe: {
      const auto byte_of = byte_level_alphabet();
      const nlohmann::json vocab = read_json_file(tokenizer.vocab_file);
      for (const auto& [key, id] : vocab.items()) {
        place(id.get<std::int64_t>(), key_bytes(key, byte_of));
      }
      how = "tokens decoded with --vocab-file's byte-level vocabulary";
      return pieces;
    }
    case TokenizerType::huggingface: {
      const auto definition = read_json_file(std::filesystem::path(tokenizer.tokenizer_model) / "tokenizer.json");
      const bool byte_level = definition.contains("decoder") && definition.at("decoder").is_object() &&
                              definition.at("decoder").contains("type") &&
                              definition.at("decoder").at("type") == "ByteLevel";
      const nlohmann::json& model = definition.at("model");
      if (!byte_level || !model.contains("vocab") || !model.at("vocab").is_object()) break;
      const auto byte_of = byte_level_alphabet();
      for (const auto& [key, id] : model.at("vocab").items()) place(id.get<std::int64_t>(), key_bytes(key, byte_of));
      if (definition.contains("added_tokens") && definition.at("added_tokens").is_array()) {
        for (const nlohmann::json& added : definition.at("added_tokens")) {
          place(added.at("id").get<std::int64_t>(), added.at("content").get<std::string>());
        }
      }
      how = "tokens decoded with tokenizer.json's byte-level vocabulary";
      return pieces;
    }
    default:
      break;
  }
  how = "tokens shown as ids (tandem decodes the byte tokenizer, GPT2BPETokenizer and byte-level "
        "HuggingFaceTokenizer vocabularies only)";
  return {};
}

class TokenNames {
 public:
  explicit TokenNames(const InspectContext& context)
      : pieces_(token_bytes(context.tokenizer, how_)),
        eod_(context.tokenizer.eod_token),
        pad_(context.tokenizer.pad_token) {}

  const std::string& how() const { return how_; }
  bool is_eod(std::int32_t token) const { return token == eod_; }
  bool is_pad(std::int32_t token) const { return pad_ != kNoPadToken && token == pad_; }

  // "104 'h'", "256 <EOD>", "257 <PAD>"; a token tandem cannot decode as the id alone.
  std::string name(std::int32_t token) const {
    std::string text = std::to_string(token);
    if (is_eod(token)) return text + " <EOD>";
    if (is_pad(token)) return text + " <PAD>";
    if (const std::string* bytes = piece(token)) return text + " " + quote_bytes(*bytes, '\'');
    return text;
  }

  // The tokens of one document piece: quoted text (or the ids when one cannot be decoded), then
  // <EOD> and <PAD> x N; padding alone as <PAD> x N.
  std::string text(std::span<const std::int32_t> tokens) const {
    std::string bytes;
    std::string ids;
    bool decoded = !pieces_.empty();
    std::int64_t pads = 0;
    for (const std::int32_t token : tokens) {
      if (is_eod(token) || is_pad(token)) {
        pads += is_pad(token) ? 1 : 0;
        continue;
      }
      ids += (ids.empty() ? "" : " ") + std::to_string(token);
      if (const std::string* piece_bytes = piece(token)) bytes += *piece_bytes;
      else decoded = false;
    }
    if (ids.empty() && pads > 0) return "<PAD> x " + std::to_string(pads);
    std::string out = decoded ? quote_bytes(bytes, '"') : "ids [" + ids + "]";
    if (!tokens.empty() && is_eod(tokens.back())) out += " <EOD>";
    if (pads > 0) out += " <PAD> x " + std::to_string(pads);
    return out;
  }

 private:
  const std::string* piece(std::int32_t token) const {
    if (token < 0 || static_cast<std::size_t>(token) >= pieces_.size()) return nullptr;
    return &pieces_[static_cast<std::size_t>(token)];
  }

  std::string how_;
  std::vector<std::string> pieces_;  // [ids] the bytes of each token; empty: shown as ids
  std::int32_t eod_;
  std::int32_t pad_;
};

std::string on_off(bool flag) { return flag ? "on" : "off"; }

std::string pad_right(std::string text, std::size_t width) {
  if (text.size() < width) text.append(width - text.size(), ' ');
  return text;
}

// Why position t's loss mask is what it is (SPEC 3), in words; the mask itself is the sample's.
std::string loss_note(const Sample& sample, std::size_t t, const TokenNames& names) {
  const std::int32_t input = sample.tokens[t];
  const std::int32_t label = sample.labels[t];
  if (sample.loss_mask[t] == 0) {
    if (names.is_pad(input)) return "padding: not learned";
    if (names.is_pad(label)) return "label is padding: not learned";
    if (names.is_eod(input)) return "input is EOD: the label starts another document, not learned";
    return "not learned";
  }
  if (names.is_eod(label)) return "learns the EOD";
  if (names.is_eod(input)) return "input is EOD, learned (--no-eod-mask-loss)";
  return "";
}

}  // namespace

std::string describe_sample(const Sample& sample, std::span<const std::int32_t> window,
                            const InspectContext& context) {
  const std::size_t seq = sample.tokens.size();
  if (window.size() != seq + 1) {
    throw std::invalid_argument("describe_sample: the window has " + std::to_string(window.size()) +
                                " tokens; sample " + std::to_string(sample.global_index) +
                                " needs its " + std::to_string(seq) + " inputs + 1");
  }
  const TokenNames names(context);
  std::ostringstream out;
  out << "sample " << sample.global_index << " of " << context.source << "\n"
      << "tokenizer: " << tokenizer_summary(context.tokenizer, context.vocab_size)
      << "; " << names.how() << "\n"
      << "window: " << seq + 1 << " tokens = " << seq << " inputs + the last label\n"
      << "masks (SPEC 3): --reset-position-ids " << on_off(context.reset_position_ids)
      << ", --reset-attention-mask " << on_off(context.reset_attention_mask) << ", --eod-mask-loss "
      << on_off(context.eod_mask_loss) << "\n"
      << "counts: " << sample.input_tokens << " input tokens, " << sample.loss_tokens
      << " loss tokens, " << sample.pad_tokens << " pad tokens\n\n";

  // Documents of the window: a new one begins after each EOD; padding is its own piece.
  std::vector<std::int64_t> document_of(window.size(), 0);  // [seq+1] piece number of each slot
  out << "documents (window slots; a document cut by the window's edge continues in another sample):\n";
  std::size_t begin = 0;
  std::int64_t document = 0;
  for (std::size_t slot = 0; slot < window.size(); ++slot) {
    const bool last = slot + 1 == window.size();
    const bool ends = names.is_eod(window[slot]) ||
                      (!last && names.is_pad(window[slot + 1]) != names.is_pad(window[slot]));
    document_of[slot] = document;
    if (!ends && !last) continue;
    out << "  doc " << document << "  slots " << begin << ".." << slot << "  "
        << names.text(window.subspan(begin, slot + 1 - begin)) << "\n";
    begin = slot + 1;
    ++document;
  }

  out << "\nslot  doc  " << pad_right("input", 14) << pad_right("label", 14)
      << "loss  position  attends  note\n";
  for (std::size_t t = 0; t < seq; ++t) {
    std::ostringstream row;
    row << pad_right(std::to_string(t), 6) << pad_right(std::to_string(document_of[t]), 5)
        << pad_right(names.name(sample.tokens[t]), 14) << pad_right(names.name(sample.labels[t]), 14)
        << pad_right(std::to_string(sample.loss_mask[t]), 6)
        << pad_right(std::to_string(sample.positions[t]), 10)
        << pad_right(std::to_string(sample.attention_start[t]) + ".." + std::to_string(t), 9)
        << loss_note(sample, t, names);
    std::string line = row.str();
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << "\n";
  }
  return out.str();
}

}  // namespace tandem::data
