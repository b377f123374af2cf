//! Chat templates: renders a GGUF's `tokenizer.chat_template` (Jinja) for a list of messages.
//!
//! ref: ggml-compute-semantics.md §5.1 `tokenizer.chat_template`. The environment matches the one
//! Hugging Face's `apply_chat_template` uses (`trim_blocks`, `lstrip_blocks`, loop controls,
//! Python string methods, `raise_exception`, `strftime_now`), so templates written for it render
//! the same here.

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{context, Environment, ErrorKind, Value};

use super::Tokenizer;
use crate::error::{Error, Result};

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, ...
    pub role: String,
    /// The text.
    pub content: String,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: &str, content: &str) -> Self {
        ChatMessage { role: role.to_owned(), content: content.to_owned() }
    }
}

/// A compiled chat template with the model's BOS and EOS texts.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("bos", &self.bos).field("eos", &self.eos).finish()
    }
}

fn model_err(e: minijinja::Error) -> Error {
    let mut msg = format!("chat template: {e}");
    let mut src = std::error::Error::source(&e);
    while let Some(s) = src {
        msg.push_str(&format!(": {s}"));
        src = s.source();
    }
    Error::Model(msg)
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token` and `eos_token` are the texts the template sees.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(model_err)?;
        env.set_syntax(syntax);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> std::result::Result<Value, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |fmt: String| strftime_now(&fmt));
        env.add_filter("tojson", tojson);
        env.add_template_owned("chat", source.to_owned()).map_err(model_err)?;
        Ok(ChatTemplate { env, bos: bos_token.to_owned(), eos: eos_token.to_owned() })
    }

    /// The template of `tok`'s GGUF, with its BOS/EOS texts; `None` if the file has none.
    pub fn from_tokenizer(tok: &Tokenizer) -> Result<Option<Self>> {
        let Some(src) = tok.chat_template() else { return Ok(None) };
        let text = |id: Option<u32>| id.and_then(|id| tok.vocab().text(id)).unwrap_or("").to_owned();
        Self::new(src, &text(tok.bos()), &text(tok.eos())).map(Some)
    }

    /// Renders the conversation; with `add_generation_prompt` the template opens the assistant's turn.
    pub fn apply(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let t = self.env.get_template("chat").map_err(model_err)?;
        t.render(context! {
            messages => messages_value(messages),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos.as_str(),
            eos_token => self.eos.as_str(),
        })
        .map_err(model_err)
    }
}

fn messages_value(messages: &[ChatMessage]) -> Value {
    let list: Vec<Value> = messages
        .iter()
        .map(|m| {
            Value::from_pairs([
                ("role", Value::from(m.role.as_str())),
                ("content", Value::from(m.content.as_str())),
            ])
        })
        .collect();
    Value::from(list)
}

/// `tojson` as Hugging Face defines it: Python's `json.dumps` with `ensure_ascii=False` (`", "` and
/// `": "` separators, no HTML escaping, keys in insertion order), optionally indented.
fn tojson(value: Value, kwargs: Kwargs) -> std::result::Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    // Accepted for compatibility; ensure_ascii=False and unsorted keys are what chat templates use.
    let _: Option<Value> = kwargs.get("ensure_ascii")?;
    let _: Option<Value> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(&value, indent, 0, &mut out)?;
    Ok(Value::from(out))
}

fn write_json_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

fn write_json(
    v: &Value,
    indent: Option<usize>,
    level: usize,
    out: &mut String,
) -> std::result::Result<(), minijinja::Error> {
    let newline = |out: &mut String, level: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * level));
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if v.is_integer() {
                out.push_str(&v.to_string());
            } else {
                let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
                if f.is_nan() {
                    out.push_str("NaN");
                } else if f.is_infinite() {
                    out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
                } else if f.fract() == 0.0 && f.abs() < 1e16 {
                    out.push_str(&format!("{f:.1}"));
                } else {
                    out.push_str(&format!("{f}"));
                }
            }
        }
        ValueKind::String => write_json_str(v.as_str().unwrap_or(""), out),
        ValueKind::Map => {
            let keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, level + 1);
                match k.as_str() {
                    Some(s) => write_json_str(s, out),
                    None => write_json_str(&k.to_string(), out),
                }
                out.push_str(": ");
                write_json(&v.get_item(k)?, indent, level + 1, out)?;
            }
            newline(out, level);
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, level + 1);
                write_json(item, indent, level + 1, out)?;
            }
            newline(out, level);
            out.push(']');
        }
        kind => {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson cannot serialize a {kind}"),
            ))
        }
    }
    Ok(())
}

/// `strftime_now(fmt)` for the handful of fields chat templates use (`%d %b %Y %m %B %H %M %S %%`),
/// in UTC.
fn strftime_now(fmt: &str) -> String {
    let secs =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    format_time(fmt, secs)
}

fn format_time(fmt: &str, secs: u64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    // Civil-from-days (proleptic Gregorian), for days since 1970-01-01.
    let days = (secs / 86_400) as i64;
    let sod = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let month = MONTHS[(m - 1) as usize];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('Y') => out.push_str(&y.to_string()),
            Some('b') => out.push_str(&month[..3]),
            Some('B') => out.push_str(month),
            Some('H') => out.push_str(&format!("{:02}", sod / 3600)),
            Some('M') => out.push_str(&format!("{:02}", sod / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", sod % 60)),
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        // 2024-02-29 13:05:09 UTC.
        assert_eq!(
            format_time("%d %b %Y %H:%M:%S %B %m %%", 1_709_211_909),
            "29 Feb 2024 13:05:09 February 02 %"
        );
        assert_eq!(format_time("%Y-%m-%d", 0), "1970-01-01");
    }

    #[test]
    fn chatml_with_trim_blocks() {
        let src = "{% for m in messages %}\n<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}\n{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        let out = t.apply(&[ChatMessage::new("user", " hi ")], true).unwrap();
        assert_eq!(out, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
        let e = ChatTemplate::new("{{ raise_exception('nope') }}", "", "").unwrap().apply(&[], false);
        assert!(e.unwrap_err().to_string().contains("nope"));
        let py = ChatTemplate::new("{{ 'a b'.split(' ')[1].upper() }}", "", "").unwrap();
        assert_eq!(py.apply(&[], false).unwrap(), "B");
    }
}
