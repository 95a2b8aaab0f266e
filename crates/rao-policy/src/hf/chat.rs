//! Chat templates: the Jinja templates of `tokenizer_config.json`, rendered with minijinja set up
//! as transformers sets up Jinja (blocks trimmed, Python's string methods, `raise_exception`),
//! with a bound on the work one rendering may do (templates are untrusted input).

use minijinja::syntax::SyntaxConfig;
use minijinja::value::Serde;
use minijinja::{Environment, Error, ErrorKind, context};
use serde_json::Value;

/// Enough for any real template over long conversations; a template that loops forever stops.
const FUEL: u64 = 50_000_000;

pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl ChatTemplate {
    pub fn new(source: String, bos_token: Option<String>, eos_token: Option<String>) -> Result<ChatTemplate, String> {
        let mut env = Environment::new();
        env.set_syntax(SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build().map_err(|e| e.to_string())?);
        env.set_fuel(Some(FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, message))
        });
        env.add_template_owned("chat", source).map_err(|e| format!("chat template does not parse: {e}"))?;
        Ok(ChatTemplate { env, bos_token, eos_token })
    }

    /// The prompt text of a conversation: `messages` as transformers takes them (`[{"role":
    /// …, "content": …}, …]`), with the assistant's turn opened when `add_generation_prompt`.
    pub fn render(&self, messages: &Value, add_generation_prompt: bool) -> anyhow::Result<String> {
        let template = self.env.get_template("chat").expect("added in new");
        template
            .render(context! {
                messages => Serde(messages),
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token.clone(),
                eos_token => self.eos_token.clone(),
            })
            .map_err(|e| anyhow::anyhow!("chat template: {e}"))
    }
}
