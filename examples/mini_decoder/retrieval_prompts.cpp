// Prompts of the real-model retrieval suite (see retrieval_prompts.h).
#include "retrieval_prompts.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <random>

#include "kvc/core/error.h"
#include "tokenizer.h"

namespace kvc {
namespace mini_decoder {
namespace {

// --- prose filler: bland sentences without digits or any of the facts' words -----------------
const char* const kSubjects[] = {
    "The old miller",     "A tired traveller",     "The village baker", "Our neighbour",
    "The school teacher", "A young shepherd",      "The town clerk",    "An apprentice carpenter",
    "The innkeeper",      "A quiet librarian",     "The gardener",      "A wandering musician",
    "The blacksmith",     "My grandmother",        "The postman",       "A curious child",
    "The weaver",         "The mayor's secretary", "A retired sailor",  "The potter",
    "The beekeeper",      "A cheerful cook",       "The stable boy",    "The painter"};
const char* const kVerbs[] = {"walked slowly along",
                              "painted a picture of",
                              "talked for hours about",
                              "carefully repaired",
                              "wrote a long letter about",
                              "dreamed again of",
                              "quietly watched",
                              "sang a song about",
                              "forgot almost everything about",
                              "cleaned",
                              "visited",
                              "described",
                              "complained about",
                              "drew a map of",
                              "read a story about",
                              "laughed at",
                              "thought about",
                              "asked a question about",
                              "photographed",
                              "admired"};
const char* const kObjects[] = {"the narrow bridge over the stream",
                                "the yellow fields behind the mill",
                                "the grey clouds above the hills",
                                "the wooden fence near the orchard",
                                "the busy market square",
                                "the lanterns along the quay",
                                "the apple trees in the garden",
                                "the stone chapel on the hill",
                                "the long road to the next valley",
                                "the empty benches in the park",
                                "the muddy path through the forest",
                                "the bright windows of the bakery",
                                "the tall grass by the pond",
                                "the old clock in the hall",
                                "the baskets of fresh bread",
                                "the roof of the railway station",
                                "the sheep on the southern slope",
                                "the blue shutters of the inn",
                                "the smoke from the chimneys",
                                "the boats drawn up on the sand"};
const char* const kAdjuncts[] = {"before breakfast",
                                 "in the late afternoon",
                                 "while the rain kept falling",
                                 "as the bells rang",
                                 "after the long winter",
                                 "on a windy morning",
                                 "during the quiet evening",
                                 "without saying a word",
                                 "with great patience",
                                 "for no particular reason",
                                 "",
                                 "",
                                 ""};

// --- config filler: env-style lines (values never contain the digits 3 and 7 together) -------
const char* const kKeyPrefixes[] = {"CACHE",  "WORKER",  "HTTP", "QUEUE",   "LOG",
                                    "RETRY",  "DB",      "AUTH", "METRICS", "SCHEDULER",
                                    "UPLOAD", "SESSION", "MAIL", "SEARCH",  "STORAGE"};
const char* const kKeySuffixes[] = {
    "TIMEOUT_MS", "POOL_SIZE", "MAX_CONNECTIONS", "LEVEL", "INTERVAL_S", "ENABLED",
    "PATH",       "PORT",      "BACKOFF_MS",      "RATIO", "MAX_ITEMS",  "REGION"};
const char* const kValues[] = {"8",       "16",           "32",    "64",   "100",     "128",
                               "250",     "500",          "1000",  "2048", "4096",    "30",
                               "60",      "90",           "120",   "5",    "10",      "15",
                               "20",      "true",         "false", "info", "warn",    "debug",
                               "eu-west", "/var/lib/app", "0.5",   "0.25", "us-east", "/tmp/spool"};
const char* const kSections[] = {"worker settings", "logging",        "network",
                                 "storage",         "authentication", "metrics export",
                                 "mail relay",      "search index",   "upload limits"};

template <class T, std::size_t N>
const T& pick(std::mt19937& rng, const T (&a)[N]) {
  return a[rng() % N];
}

std::string prose_sentence(std::mt19937& rng) {
  std::string s =
      std::string(pick(rng, kSubjects)) + " " + pick(rng, kVerbs) + " " + pick(rng, kObjects);
  const std::string adj = pick(rng, kAdjuncts);
  if (!adj.empty()) s += " " + adj;
  return s + ".";
}

std::string config_line(std::mt19937& rng) {
  if (rng() % 9 == 0) return std::string("\n# --- ") + pick(rng, kSections) + " ---";
  return std::string(pick(rng, kKeyPrefixes)) + "_" + pick(rng, kKeySuffixes) + "=" +
         pick(rng, kValues);
}

// The demo's document (demo_prompt.txt without its question line).
const char* const kDemoDocument =
    R"DOC(Notes from the harbour town of Saltmere, written by the keeper of the old lighthouse.

The lighthouse keeper's cat is named Biscuit. She is grey with one white paw, and she sleeps on the warm lamp room floor every afternoon.

Spring came late this year. The fishing boats stayed in the harbour for most of March because the wind from the north did not stop for three weeks. The fishermen mended their nets on the quay and argued about the weather, as they always do. The baker on Rope Street sold out of bread every morning before eight, and the school children spent their breaks watching the waves break over the sea wall.

In April the council finally repaired the road to the next village. For years the carts had to go the long way around the hill, and the farmers complained at every market day. Now the new road is smooth and wide, and the post arrives a day earlier than before. The council also painted the benches in the park green, which nobody had asked for, but most people seem to like it.

The old chapel on the cliff had a new roof put on in May. The carpenters worked for six weeks, and on the last day the whole town brought food and music up the hill. Someone's dog stole an entire ham from the table, and the children chased it all the way down to the beach. The priest said it was the best celebration the chapel had seen in forty years.

Summer brought the usual visitors. They rented rooms above the inn, walked along the cliffs, and asked the same questions about the lighthouse: how high it is, how far the light can be seen, and whether the keeper ever gets lonely. The answers are forty metres, about twenty nautical miles, and no, not really. There is always something to do: the lamp must be cleaned, the log must be written, the stairs must be swept, and the garden behind the tower needs water every evening when it does not rain.

In August a storm came in from the west and lasted two days. The harbour master closed the port, and the lifeboat crew waited in their station with the doors open. Nobody was lost at sea, but the storm tore the sails of two yachts and carried away half of the old pier. The town has started collecting money to rebuild it before next summer.

Autumn has been quiet. The apples in the orchards were good this year, and the cider press behind the inn has been running every weekend. The evenings are getting longer, and the light in the tower now turns on before six o'clock.)DOC";

struct Needle {
  double depth;
  std::string text;
};

struct TaskSpec {
  bool config = false;
  std::vector<Needle> needles;
  std::string question;
  std::string answer_prefix;
  std::vector<std::string> expected;
  std::vector<std::string> forbidden;
};

TaskSpec spec_of(const std::string& task) {
  TaskSpec t;
  if (task == "passkey") {
    t.needles = {{0.5, "The pass key is 58231. Remember it. 58231 is the pass key."}};
    t.question = "What is the pass key?";
    t.answer_prefix = "The pass key is";
    t.expected = {"58231"};
  } else if (task == "multi_needle") {
    t.needles = {{0.2, "The secret code of the red box is 4127."},
                 {0.7, "The secret code of the blue box is 8356."}};
    t.question =
        "What is the secret code of the red box, and what is the secret code of the blue box?";
    t.answer_prefix = "The secret code of the red box is";
    t.expected = {"4127", "8356"};
  } else if (task == "distractor") {
    t.needles = {{0.3, "The access code for the south gate is 1748."},
                 {0.65, "The access code for the north gate is 6293."}};
    t.question = "What is the access code for the north gate?";
    t.answer_prefix = "The access code for the north gate is";
    t.expected = {"6293"};
    t.forbidden = {"1748"};
  } else if (task == "fact_early" || task == "fact_middle" || task == "fact_late") {
    const double depth = task == "fact_early" ? 0.05 : task == "fact_middle" ? 0.5 : 0.9;
    if (task == "fact_early") {
      t.needles = {{depth, "The lighthouse keeper's cat is named Biscuit."}};
      t.question = "What is the name of the lighthouse keeper's cat?";
      t.answer_prefix = "The lighthouse keeper's cat is named";
      t.expected = {"Biscuit"};
    } else if (task == "fact_middle") {
      t.needles = {{depth, "The harvest festival of Eldmoor is always held in Copperfield Barn."}};
      t.question = "Where is the harvest festival of Eldmoor held?";
      t.answer_prefix = "The harvest festival of Eldmoor is held in";
      t.expected = {"Copperfield"};
    } else {
      t.needles = {{depth, "The chief engineer of the river ferry is Marguerite Okafor."}};
      t.question = "Who is the chief engineer of the river ferry?";
      t.answer_prefix = "The chief engineer of the river ferry is";
      t.expected = {"Okafor"};
    }
  } else if (task.rfind("demo_", 0) == 0) {
    // The demo's document, whole, as one needle in the middle of the filler; several questions.
    t.needles = {{0.5, kDemoDocument}};
    if (task == "demo_cat") {
      t.question = "What is the name of the lighthouse keeper's cat?";
      t.answer_prefix = "The lighthouse keeper's cat is named";
      t.expected = {"Biscuit"};
    } else if (task == "demo_baker") {
      t.question = "On which street is the baker?";
      t.answer_prefix = "The baker is on";
      t.expected = {"Rope"};
    } else if (task == "demo_storm") {
      t.question = "How long did the storm in August last?";
      t.answer_prefix = "The storm lasted";
      t.expected = {"two days"};
    } else if (task == "demo_chapel") {
      t.question = "For how many weeks did the carpenters work on the chapel roof?";
      t.answer_prefix = "The carpenters worked for";
      t.expected = {"six"};
    } else {
      KVC_CHECK(task == "demo_height", "retrieval: task '", task, "' is unknown");
      t.question = "How high is the lighthouse?";
      t.answer_prefix = "The lighthouse is";
      t.expected = {"forty"};
    }
  } else if (task == "code_config") {
    t.config = true;
    t.needles = {{0.1,
                  "\n# --- archived settings from release 2.3 (inactive, kept for reference) ---\n"
                  "# KVC_BATCH_LIMIT=73\n# KVC_BATCH_WINDOW_MS=250\n"},
                 {0.6,
                  "\n# --- active settings of the current release ---\n"
                  "KVC_BATCH_LIMIT=37\nKVC_BATCH_WINDOW_MS=120\n"}};
    t.question = "In the configuration file above, what is the active value of KVC_BATCH_LIMIT?";
    t.answer_prefix = "The active value of KVC_BATCH_LIMIT is";
    t.expected = {"37"};
    t.forbidden = {"73"};
  } else {
    KVC_CHECK(false, "retrieval: task '", task, "' is unknown");
  }
  return t;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::uint32_t hash_of(const std::string& s) {
  std::uint32_t h = 2166136261u;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 16777619u;
  return h;
}

}  // namespace

const std::vector<std::string>& retrieval_tasks() {
  static const std::vector<std::string> t = {
      "passkey",     "multi_needle", "distractor", "fact_early", "fact_middle", "fact_late",
      "code_config", "demo_cat",     "demo_baker", "demo_storm", "demo_chapel", "demo_height"};
  return t;
}

RetrievalPrompt make_retrieval_prompt(const std::string& task, int target_tokens,
                                      const Tokenizer& tok, unsigned seed) {
  const TaskSpec spec = spec_of(task);
  std::mt19937 rng(hash_of(task) ^ (static_cast<std::uint32_t>(target_tokens) * 2654435761u) ^
                   seed);
  const std::string intro = spec.config ? "Here is a configuration file.\n\n"
                                        : "Here is a long story. Read it carefully.\n\n";
  const std::string outro = "\n\nQuestion: " + spec.question + " Answer briefly.";
  const auto chat_tokens = [&](const std::string& user) {
    return static_cast<int>(
        tok.encode(tok.chat_prompt({{"user", user}}, true) + spec.answer_prefix, true).size());
  };
  std::string needles_text;
  for (const Needle& n : spec.needles) needles_text += n.text;
  const int overhead = chat_tokens(intro + needles_text + outro);
  KVC_CHECK(target_tokens >= overhead + 16, "retrieval: target_tokens = ", target_tokens,
            " leaves no room for filler in task '", task, "' (", overhead, " tokens without it)");

  // Filler units with their token counts (each as it appears after a separator).
  const std::string sep = spec.config ? "\n" : " ";
  std::vector<std::string> units;
  std::vector<int> unit_tokens;
  int budget = target_tokens - overhead;
  int total = 0;
  while (total < budget) {
    std::string u = spec.config ? config_line(rng) : prose_sentence(rng);
    if (!spec.config && rng() % 7 == 0) u = "\n\n" + u;  // paragraphs
    const int n = static_cast<int>(tok.encode(sep + u, false).size());
    units.push_back(u);
    unit_tokens.push_back(n);
    total += n;
  }

  RetrievalPrompt p;
  p.task = task;
  p.target_tokens = target_tokens;
  p.question = spec.question;
  p.answer_prefix = spec.answer_prefix;
  p.expected = spec.expected;
  p.forbidden = spec.forbidden;
  // Assemble; drop filler units from the end until the prompt fits the target.
  for (;;) {
    int filler_total = 0;
    for (std::size_t i = 0; i < units.size(); ++i) filler_total += unit_tokens[i];
    std::string doc;
    std::vector<std::size_t> offsets;
    std::size_t next = 0;
    int seen = 0;
    for (std::size_t i = 0; i <= units.size(); ++i) {
      while (next < spec.needles.size() &&
             seen >= static_cast<int>(spec.needles[next].depth * filler_total)) {
        if (!doc.empty()) doc += sep;
        offsets.push_back(intro.size() + doc.size());
        doc += spec.needles[next].text;
        ++next;
      }
      if (i == units.size()) break;
      if (!doc.empty()) doc += sep;
      doc += units[i];
      seen += unit_tokens[i];
    }
    p.user_text = intro + doc + outro;
    p.needle_offsets = offsets;
    const int n = chat_tokens(p.user_text);
    if (n <= target_tokens || units.size() <= 1) break;
    const int drop = std::max(1, (n - target_tokens) / 12 + 1);
    for (int d = 0; d < drop && units.size() > 1; ++d) {
      units.pop_back();
      unit_tokens.pop_back();
    }
  }
  p.text = tok.chat_prompt({{"user", p.user_text}}, true) + p.answer_prefix;
  for (const Needle& n : spec.needles) {
    p.needles.push_back(n.text);
    p.needle_depths.push_back(n.depth);
  }
  return p;
}

const std::string& demo_document() {
  static const std::string d = kDemoDocument;
  return d;
}

std::string retrieval_prompt_text(const RetrievalPrompt& p) { return p.text; }

bool retrieval_passes(const RetrievalPrompt& p, const std::string& answer) {
  const std::string a = lower(answer);
  for (const std::string& e : p.expected) {
    if (a.find(lower(e)) == std::string::npos) return false;
  }
  for (const std::string& f : p.forbidden) {
    if (a.find(lower(f)) != std::string::npos) return false;
  }
  return true;
}

}  // namespace mini_decoder
}  // namespace kvc
