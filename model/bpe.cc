#include "model/bpe.h"

#include <algorithm>
#include <array>
#include <queue>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "model/json_escape.h"
#include "model/pretokenizer.h"
#include "model/utf8.h"

namespace fpa {
namespace {

struct Merge {
  int32_t rank;
  int32_t result;
};

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

class BpeTokenizer final : public Tokenizer {
 public:
  BpeTokenizer(BpeSpec spec, std::optional<Pretokenizer> pre)
      : spec_(std::move(spec)), pre_(std::move(pre)) {}
  absl::Status index();

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string_view token_bytes(int32_t id) const override {
    if (id < 0 || static_cast<size_t>(id) >= text_.size() || special_[id]) return {};
    return text_[id];
  }
  bool is_special(int32_t id) const override {
    return id >= 0 && static_cast<size_t>(id) < special_.size() && special_[id];
  }
  int vocab_size() const override { return static_cast<int>(text_.size()); }
  const SpecialTokens& special() const override { return spec_.special; }
  std::string kind() const override { return spec_.json_escape ? "bpe-json" : "bpe"; }
  bool json_escaped() const override { return spec_.json_escape; }

 private:
  void encode_segment(std::string_view segment, std::vector<int32_t>& ids) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& ids) const;
  // The added token starting leftmost in text[from, ...), longest first: {position, index}.
  std::pair<size_t, const AddedToken*> next_added(std::string_view text, size_t from) const;

  BpeSpec spec_;
  std::optional<Pretokenizer> pre_;
  std::vector<std::string> text_;  // id -> bytes (added tokens' content included)
  std::vector<bool> special_;
  std::unordered_map<std::string, int32_t> ids_;  // the BPE vocabulary, bytes -> id
  std::array<int32_t, 256> byte_ids_;
  std::unordered_map<uint64_t, Merge> merges_;
};

absl::Status BpeTokenizer::index() {
  text_ = spec_.vocab;
  for (size_t id = 0; id < text_.size(); ++id) ids_.emplace(text_[id], static_cast<int32_t>(id));
  for (const AddedToken& t : spec_.added) {
    if (t.id < 0) return absl::InvalidArgumentError(absl::StrCat("added token id ", t.id));
    if (static_cast<size_t>(t.id) >= text_.size()) text_.resize(t.id + 1);
    text_[t.id] = t.content;
  }
  special_.assign(text_.size(), false);
  for (const AddedToken& t : spec_.added) special_[t.id] = t.special;
  for (int b = 0; b < 256; ++b) {
    auto it = ids_.find(std::string(1, static_cast<char>(b)));
    if (it == ids_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("vocab: no token for byte ", b));
    }
    byte_ids_[b] = it->second;
  }
  for (size_t rank = 0; rank < spec_.merges.size(); ++rank) {
    const auto& [a, b] = spec_.merges[rank];
    auto ia = ids_.find(a), ib = ids_.find(b), ir = ids_.find(a + b);
    if (ia == ids_.end() || ib == ids_.end() || ir == ids_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("merges: merge ", rank, " has a part or result not in the vocabulary"));
    }
    merges_.try_emplace(pair_key(ia->second, ib->second),
                        Merge{static_cast<int32_t>(rank), ir->second});
  }
  spec_.vocab.clear();
  spec_.merges.clear();
  return absl::OkStatus();
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view raw) const {
  std::string text = utf8::sanitize(raw);
  if (spec_.json_escape) text = json_escape(text);
  std::vector<int32_t> ids;
  if (spec_.add_bos && spec_.special.bos) ids.push_back(*spec_.special.bos);
  size_t at = 0;
  while (at < text.size()) {
    auto [pos, added] = next_added(text, at);
    encode_segment(std::string_view(text).substr(at, pos - at), ids);
    if (added == nullptr) break;
    ids.push_back(added->id);
    at = pos + added->content.size();
  }
  return ids;
}

std::pair<size_t, const AddedToken*> BpeTokenizer::next_added(std::string_view text,
                                                              size_t from) const {
  std::pair<size_t, const AddedToken*> best{text.size(), nullptr};
  for (const AddedToken& t : spec_.added) {
    if (t.content.empty()) continue;
    size_t pos = text.find(t.content, from);
    if (pos == std::string_view::npos) continue;
    if (pos < best.first || (pos == best.first && t.content.size() > best.second->content.size())) {
      best = {pos, &t};
    }
  }
  return best;
}

void BpeTokenizer::encode_segment(std::string_view segment, std::vector<int32_t>& ids) const {
  if (segment.empty()) return;
  std::string prefixed;
  if (spec_.add_prefix_space && segment[0] != ' ') {
    prefixed.push_back(' ');
    prefixed.append(segment);
    segment = prefixed;
  }
  if (!pre_) return encode_piece(segment, ids);
  for (std::string_view piece : pre_->split(segment)) encode_piece(piece, ids);
}

// Merges the lowest-ranked adjacent pair first, the leftmost among equals, as Hugging Face's BPE
// does, in O(n log n) so that a long piece (a run of spaces) cannot stall the server.
void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& ids) const {
  if (spec_.ignore_merges) {
    if (auto it = ids_.find(std::string(piece)); it != ids_.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  const int n = static_cast<int>(piece.size());
  std::vector<int32_t> sym(n), next(n), prev(n);
  for (int i = 0; i < n; ++i) {
    sym[i] = byte_ids_[static_cast<unsigned char>(piece[i])];
    next[i] = i + 1;
    prev[i] = i - 1;
  }
  struct Candidate {
    int32_t rank, pos, left, right;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto consider = [&](int i) {
    if (i < 0 || next[i] >= n) return;
    auto it = merges_.find(pair_key(sym[i], sym[next[i]]));
    if (it != merges_.end()) queue.push({it->second.rank, i, sym[i], sym[next[i]]});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);
  while (!queue.empty()) {
    Candidate c = queue.top();
    queue.pop();
    // Stale when either side has merged since (a removed symbol's id is -1).
    if (sym[c.pos] != c.left || next[c.pos] >= n || sym[next[c.pos]] != c.right) continue;
    int right = next[c.pos];
    sym[c.pos] = merges_.at(pair_key(c.left, c.right)).result;
    sym[right] = -1;
    next[c.pos] = next[right];
    if (next[right] < n) prev[next[right]] = c.pos;
    consider(prev[c.pos]);
    consider(c.pos);
  }
  for (int i = 0; i < n; i = next[i]) ids.push_back(sym[i]);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> make_bpe_tokenizer(BpeSpec spec) {
  std::optional<Pretokenizer> pre;
  if (!spec.pattern.empty()) {
    absl::StatusOr<Pretokenizer> compiled = Pretokenizer::compile(spec.pattern);
    if (!compiled.ok()) return compiled.status();
    pre = std::move(*compiled);
  }
  auto tokenizer = std::make_unique<BpeTokenizer>(std::move(spec), std::move(pre));
  if (absl::Status s = tokenizer->index(); !s.ok()) return s;
  return tokenizer;
}

}  // namespace fpa
