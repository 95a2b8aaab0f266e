//! `hf_export`: a language model's checkpoint as a Hugging Face directory that transformers,
//! vLLM and llama.cpp's converters read — `config.json`, `generation_config.json`,
//! `model.safetensors` (f32, LoRA adapters merged in) and the tokenizer files — and, for a
//! checkpoint of LoRA adapters, the adapters alone as a PEFT adapter directory (`adapter/`).

use futures::future::BoxFuture;
use rao_pipeline::{InputDecl, StageContext, TypedStage};
use rao_policy::Backend;
use rao_policy::hf;
use schemars::JsonSchema;
use serde::Deserialize;

use crate::neural::{BASE_INPUT, load_model};

#[derive(Debug, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HfExportParams {
    /// What a PEFT adapter names as its base (`base_model_name_or_path`), e.g. the hub name of
    /// the model `hf_model` read.
    #[serde(default = "base_name")]
    pub base_model_name: String,
    #[serde(default)]
    pub backend: Backend,
}

fn base_name() -> String {
    "base".into()
}

pub struct HfExport;

impl TypedStage for HfExport {
    fn code() -> &'static str {
        crate::code::of("hf_export")
    }
    type Params = HfExportParams;
    const NAME: &'static str = crate::kinds::HF_EXPORT;
    const VERSION: u32 = 1;
    const DESCRIBE: &'static str = "a language model's checkpoint as a Hugging Face directory (and its LoRA adapters as PEFT's)";
    const INPUTS: &'static [InputDecl] =
        &[InputDecl { name: "checkpoint", required: true }, InputDecl { name: BASE_INPUT, required: false }];
    const OUTPUTS: &'static [&'static str] = &["model"];

    fn run(ctx: StageContext, p: HfExportParams) -> BoxFuture<'static, anyhow::Result<()>> {
        Box::pin(async move {
            let model = load_model(&ctx, "checkpoint", p.backend).await?;
            let tokenizer = model.tokenizer.ok_or_else(|| {
                anyhow::anyhow!("the checkpoint is rao's own model (the environment's tokens): only a language model's exports as a Hugging Face directory")
            })?;
            let out = ctx.output_dir("model")?;
            hf::export(&model.policy, None, &out)?;
            for (name, content) in tokenizer.files().named() {
                ctx.write_output("model", name, content.as_bytes())?;
            }
            if model.policy.lora.is_some() {
                model.policy.export_peft(&p.base_model_name, &out.join("adapter"))?;
            }
            ctx.note(format!("version {} as a Hugging Face directory", model.policy.version));
            Ok(())
        })
    }
}
