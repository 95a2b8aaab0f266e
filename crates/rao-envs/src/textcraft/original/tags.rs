//! Which items satisfy a tag, decided as the original TextCraft code decides it: by the names
//! of the items its recipes mention (no tag files are read), one rule per kind of tag, checked in
//! this order. A tag no rule covers is satisfied by nothing.

/// The items of `items` (every result and concrete ingredient of the loaded recipes) that
/// satisfy tag `tag` (its name without namespace, e.g. `planks`), sorted.
pub fn members<'a>(tag: &str, items: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let tag = tag.to_lowercase();
    let items: Vec<&str> = items.into_iter().collect();
    let pick = |keep: &dyn Fn(&str) -> bool| -> Vec<String> { items.iter().copied().filter(|i| keep(i)).map(str::to_string).collect() };
    let listed = |names: &[&str]| pick(&|i| names.contains(&i));
    let mut out = if tag == "planks" {
        pick(&|i| i.ends_with("_planks"))
    } else if tag == "logs" {
        pick(&|i| i.ends_with("_log") || i.ends_with("_stem") || i == "log" || i == "stem")
    } else if let Some(wood) = tag.strip_suffix("_logs").map(|_| tag.replace("_logs", "")) {
        pick(&|i| i.starts_with(&format!("{wood}_log")) || i.starts_with(&format!("{wood}_stem")))
    } else if let Some(wood) = tag.strip_suffix("_stems").map(|_| tag.replace("_stems", "")) {
        pick(&|i| i.starts_with(&format!("{wood}_stem")) || i.starts_with(&format!("{wood}_log")))
    } else if tag.contains("wooden_slabs") || tag == "wooden_slab" {
        pick(&|i| i.contains("_slab") && (i.contains("planks") || i.contains("wood")))
    } else if tag.contains("stone_tool") {
        listed(&["cobblestone", "blackstone", "cobbled_deepslate", "stone"])
    } else if tag.contains("stone_crafting") {
        listed(&["cobblestone", "stone", "smooth_stone"])
    } else if tag == "coals" {
        listed(&["coal", "charcoal"])
    } else if tag.contains("soul_fire") {
        listed(&["soul_sand", "soul_soil"])
    } else if tag == "wool" {
        pick(&|i| i.ends_with("_wool"))
    } else {
        Vec::new()
    };
    out.sort();
    out.dedup();
    out
}
