// tokenizer_reference.js -- the reference side of zdp's tokenizer checks:
// transformers.js's tokenizers (@lenml/tokenizers, kept beside the test data
// in the shared folder; see its README) run by Node.js.
//
//   node tokenizer_reference.js corpus OUT [MB]      the deterministic mixed corpus
//   node tokenizer_reference.js compare LIB DIR CORPUS IDS [DECODED]
//        ids of CORPUS by the reference vs zdp's (IDS: one line, as `zdp tokenize`
//        prints); with DECODED (zdp's decode of its ids) also checks the round trip
//   node tokenizer_reference.js bench LIB DIR CORPUS RUNS   encode MB/s, one line per run
//
// LIB is the reference's main.js.  DIR is a tokenizer folder: tokenizer.json +
// tokenizer_config.json, or GPT-2's encoder.json + vocab.bpe, which this script
// turns into the equivalent tokenizer.json (ByteLevel pre-tokenizer with GPT-2's
// regex, <|endoftext|> the one special token) for the reference.
//
// Invalid UTF-8: the reference works on strings, so it never sees bytes.  zdp's
// rule (docs/models.md, "Tokenizers"): a byte that is not part of a well-formed
// UTF-8 character is the token of that byte and splits the text around it.  This
// script applies the same rule around the reference: it encodes each valid run
// separately and puts the byte tokens between.
"use strict";
const fs = require("fs");
const path = require("path");

// ---- the corpus ------------------------------------------------------------------

// splitmix64, as zdp_splitmix64 (zdp/core.h), in BigInt: the same stream everywhere.
function rng(seed) {
  let s = BigInt(seed);
  const M = (1n << 64n) - 1n;
  return () => {
    s = (s + 0x9E3779B97F4A7C15n) & M;
    let z = s;
    z = ((z ^ (z >> 30n)) * 0xBF58476D1CE4E5B9n) & M;
    z = ((z ^ (z >> 27n)) * 0x94D049BB133111EBn) & M;
    return Number((z ^ (z >> 31n)) >> 11n) / 2 ** 53;
  };
}

function makeCorpus(shakespeare, mb) {
  const r = rng(12);
  const pick = (a) => a[Math.floor(r() * a.length)];
  const int = (n) => Math.floor(r() * n);
  const parts = [];
  let size = 0;
  const put = (x) => {
    const b = Buffer.isBuffer(x) ? x : Buffer.from(x, "utf8");
    parts.push(b);
    size += b.length;
  };
  const cjk = "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持取设始版双历越史商千片容研像找友孩站广改议形委早房音火际则首单据导影失拿网香似斯专石若兵弟谁校读志飞观争究包组造落视济喜离虽坏兴且ひらがなカタカナ日本語한국어안녕하세요";
  const emoji = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "❤️", "🚀", "🧑🏿‍💻", "✨", "🎉", "🐍", "🏳️‍🌈", "☕", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "🀄"];
  const accented = ["café", "naïve", "São Paulo", "Ångström", "Zürich", "façade", "Dvořák", "Łódź",
    "smørrebrød", "İstanbul", "ﬁnance", "Straße", "Ελληνικά", "Русский текст", "العربية", "हिन्दी",
    "Tiếng Việt", "ÆØÅ æøå", "Œuvre", "ǅemal"];
  const words = ["the", "of", "and", "model", "train", "token", "rank", "gradient", "ZeRO", "DeepSpeed",
    "don't", "I'M", "WE'LL", "it's", "they've", "You'D", "O'Neil", "rock'n'roll", "'tis", "e-mail",
    "https://example.com/a?b=c&d=1", "user@example.org", "#hashtag", "@mention", "C++", "x86_64"];
  const specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|end_of_text|>",
    "<think>", "</think>", "<|eot_id|>", "<|start_header_id|>", "<|endof", "<|im_start", "<||>", "<|>"];
  const spaces = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000",
    "\u2009", "\u202f", "\ufeff", "\u0085", "\u2028", "\v", "\f", "    \n\t  "];
  const invalid = [[0x80], [0xbf], [0xc0, 0xaf], [0xc3], [0xe2, 0x82], [0xed, 0xa0, 0x80], [0xf0, 0x9f],
    [0xf5, 0x80, 0x80, 0x80], [0xff], [0xfe, 0xff], [0xf4, 0x90, 0x80, 0x80], [0xe0, 0x80, 0x80], [0xc2]];
  const codeLines = [
    "for (int i = 0; i < n; i++) {", "    sum += a[i] * b[i];", "}", "def f(x: int) -> int:",
    "    return x ** 2 + 3*x - 1", "if (err != NULL) return zdp_err_set(err, ZDP_ERR_IO, \"%s\", p);",
    "const std::vector<float> v{1.0f, 2.5e-3f};", "SELECT id, name FROM users WHERE age >= 21;",
    "    \"key\": [1, 2, 3], \"nested\": {\"a\": null}", "x = y != z && (p || !q) ? 0x7F : 0b1010;",
    "fn main() { println!(\"{:?}\", vec![1u8; 4]); }", "  <div class=\"row\">&nbsp;</div>",
    "#include <stdio.h>", "// TODO(zdp): fix the off-by-one", "    /* a comment */", "\tindented\twith\ttabs"];
  const shake = shakespeare.split("\n");
  let line = 0;
  while (size < mb * 1024 * 1024) {
    switch (int(9)) {
      case 0: case 1: { // English prose, in order
        const n = 5 + int(30);
        put(shake.slice(line, line + n).join("\n") + "\n");
        line = (line + n) % shake.length;
        break;
      }
      case 2: { // code
        const n = 3 + int(12);
        let s = "";
        for (let i = 0; i < n; i++) s += pick(codeLines) + pick(["\n", "\n", "\r\n", "\n\n"]);
        put(s);
        break;
      }
      case 3: { // digits and numbers
        let s = "";
        for (let i = 0; i < 12; i++)
          s += pick([String(int(10)), String(int(1e6)), String(int(1e9)) + String(int(1e9)),
            (r() * 1000).toFixed(int(6)), "-" + int(100), "1,234,567", "3.14159e-10", "2026-12-01",
            "+1 (555) 010-" + String(1000 + int(9000)), "١٢٣", "½", "²³", "Ⅻ"]) + pick([" ", ", ", "\n", "\t", ""]);
        put(s);
        break;
      }
      case 4: { // whitespace runs around words
        let s = "";
        for (let i = 0; i < 20; i++) s += pick(spaces) + pick(words);
        put(s + pick(spaces));
        break;
      }
      case 5: { // CJK and emoji, mixed with Latin
        let s = "";
        for (let i = 0; i < 30; i++) {
          const k = int(4);
          if (k === 0) s += pick(emoji);
          else if (k === 1) s += pick(words) + " ";
          else for (let j = 1 + int(8); j > 0; j--) s += cjk[int(cjk.length)];
          if (int(5) === 0) s += pick(["。", "，", "！", "？", "、", " ", "\n"]);
        }
        put(s + "\n");
        break;
      }
      case 6: { // accented letters and other scripts
        let s = "";
        for (let i = 0; i < 15; i++) s += pick(accented) + pick([" ", ", ", ". ", "\n", "'s "]);
        put(s);
        break;
      }
      case 7: { // special tokens, whole and broken, in chat-like text
        let s = "";
        for (let i = 0; i < 6; i++) s += pick(specials) + pick(["user\n", "", " ", "assistant\n", pick(words)]);
        put(s);
        break;
      }
      case 8: { // invalid UTF-8 between valid text
        put(pick(words));
        put(Buffer.from(pick(invalid)));
        put(pick([" ", "", "é", "中", "\n", "😀"]));
        break;
      }
    }
  }
  // A little text that is not NFC (decomposed accents): NFC tokenizers change it.
  put("Cafe\u0301 and nai\u0308ve and A\u030angstro\u0308m\n");
  return Buffer.concat(parts);
}

// ---- the reference tokenizer -------------------------------------------------------------

function byteEncoder() { // GPT-2's bytes_to_unicode
  const bs = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; b++) if (!bs.includes(b)) { bs.push(b); cs.push(256 + n++); }
  const enc = new Array(256);
  bs.forEach((b, i) => { enc[b] = String.fromCharCode(cs[i]); });
  return enc;
}

function load(lib, dir) {
  const { TokenizerLoader } = require(path.resolve(lib));
  let tokenizerJSON, tokenizerConfig;
  if (fs.existsSync(path.join(dir, "tokenizer.json"))) {
    tokenizerJSON = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
    tokenizerConfig = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  } else {
    const vocab = JSON.parse(fs.readFileSync(path.join(dir, "encoder.json"), "utf8"));
    const merges = fs.readFileSync(path.join(dir, "vocab.bpe"), "utf8").split("\n")
      .filter((l, i) => l.length > 0 && !(i === 0 && l.startsWith("#")));
    const bl = { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true };
    tokenizerJSON = {
      version: "1.0", truncation: null, padding: null, normalizer: null, post_processor: null,
      added_tokens: [{ id: vocab["<|endoftext|>"], content: "<|endoftext|>", single_word: false,
        lstrip: false, rstrip: false, normalized: false, special: true }],
      pre_tokenizer: bl, decoder: bl,
      model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "",
        end_of_word_suffix: "", fuse_unk: false, byte_fallback: false, vocab, merges },
    };
    tokenizerConfig = { tokenizer_class: "GPT2Tokenizer", bos_token: "<|endoftext|>",
      eos_token: "<|endoftext|>" };
  }
  return TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
}

// Length of the well-formed UTF-8 character at buf[i] (Unicode Table 3-7), or 0.
function utf8Len(buf, i) {
  const b = buf[i];
  if (b < 0x80) return 1;
  if (b < 0xc2 || b > 0xf4) return 0;
  const k = b < 0xe0 ? 2 : b < 0xf0 ? 3 : 4;
  if (i + k > buf.length) return 0;
  let lo = 0x80, hi = 0xbf;
  if (b === 0xe0) lo = 0xa0; else if (b === 0xed) hi = 0x9f;
  else if (b === 0xf0) lo = 0x90; else if (b === 0xf4) hi = 0x8f;
  if (buf[i + 1] < lo || buf[i + 1] > hi) return 0;
  for (let j = 2; j < k; j++) if ((buf[i + j] & 0xc0) !== 0x80) return 0;
  return k;
}

// The corpus as valid runs (strings) and invalid bytes (numbers), in order.
function segments(buf) {
  const out = [];
  let start = 0;
  for (let i = 0; i < buf.length;) {
    const k = utf8Len(buf, i);
    if (k > 0) { i += k; continue; }
    if (i > start) out.push(buf.toString("utf8", start, i));
    out.push(buf[i]);
    start = ++i;
  }
  if (start < buf.length) out.push(buf.toString("utf8", start));
  return out;
}

function encode(tok, segs, enc) {
  const ids = [];
  for (const s of segs) {
    if (typeof s === "number") ids.push(tok.model.tokens_to_ids.get(enc[s]));
    else for (const id of tok.encode(s, { add_special_tokens: false })) ids.push(id);
  }
  return ids;
}

// ---- commands --------------------------------------------------------------------------------

function compare(lib, dir, corpusPath, idsPath, decodedPath) {
  const tok = load(lib, dir);
  const buf = fs.readFileSync(corpusPath);
  const segs = segments(buf);
  const ref = encode(tok, segs, byteEncoder());
  const txt = fs.readFileSync(idsPath, "utf8").trim();
  const got = txt.length ? txt.split(/\s+/).map(Number) : [];
  let i = 0;
  while (i < ref.length && i < got.length && ref[i] === got[i]) i++;
  const name = path.basename(dir);
  if (i < ref.length || i < got.length) {
    const show = (a) => JSON.stringify(a.slice(Math.max(0, i - 8), i + 8));
    const text = (a) => JSON.stringify(tok.decode(a.slice(Math.max(0, i - 8), i + 8).filter((x) => x !== undefined)));
    console.log(`${name}: FAIL: first mismatch at token ${i} of ${ref.length} (zdp gave ${got.length})`);
    console.log(`  reference ids ${show(ref)}\n  zdp ids       ${show(got)}`);
    console.log(`  reference text ${text(ref)}\n  zdp text       ${text(got)}`);
    return 1;
  }
  console.log(`${name}: ${ref.length} ids identical to the reference on ${buf.length} bytes`);
  if (decodedPath) {
    // zdp's decode must give the corpus back byte for byte; where the
    // tokenizer normalizes to NFC, the corpus in NFC (each valid run).
    const nfc = tok.normalizer && JSON.stringify(tok.normalizer.config || {}).includes("NFC");
    const want = Buffer.concat(segs.map((s) => typeof s === "number" ? Buffer.from([s])
      : Buffer.from(nfc ? s.normalize("NFC") : s, "utf8")));
    const dec = fs.readFileSync(decodedPath);
    if (!dec.equals(want)) {
      let j = 0;
      while (j < dec.length && j < want.length && dec[j] === want[j]) j++;
      console.log(`${name}: FAIL: decode(encode(corpus)) differs at byte ${j}: expected ` +
        `${JSON.stringify(want.subarray(Math.max(0, j - 20), j + 20).toString("latin1"))}, got ` +
        `${JSON.stringify(dec.subarray(Math.max(0, j - 20), j + 20).toString("latin1"))}`);
      return 1;
    }
    console.log(`${name}: decode(encode(corpus)) == corpus${nfc ? " (in NFC)" : ""}, ${dec.length} bytes`);
  }
  return 0;
}

function bench(lib, dir, corpusPath, runs) {
  const tok = load(lib, dir);
  const buf = fs.readFileSync(corpusPath);
  const enc = byteEncoder();
  for (let r = 0; r < runs; r++) {
    const t0 = process.hrtime.bigint();
    tok.model.clear_cache && tok.model.clear_cache();
    const n = encode(tok, segments(buf), enc).length;
    const s = Number(process.hrtime.bigint() - t0) / 1e9;
    console.log(`${(buf.length / 1e6 / s).toFixed(3)} MB/s ${n} ids ${s.toFixed(3)} s`);
  }
  return 0;
}

const [cmd, ...a] = process.argv.slice(2);
let rc = 2;
if (cmd === "corpus") {
  const shakespeare = fs.readFileSync(a[2] || path.join(__dirname, "..", "..", "..", "shared", "data", "tinyshakespeare.txt"), "utf8");
  fs.writeFileSync(a[0], makeCorpus(shakespeare, Number(a[1] || 1.1)));
  rc = 0;
} else if (cmd === "compare") rc = compare(a[0], a[1], a[2], a[3], a[4]);
else if (cmd === "bench") rc = bench(a[0], a[1], a[2], Number(a[3] || 5));
else console.error("usage: see the comment at the top of tokenizer_reference.js");
process.exitCode = rc;
