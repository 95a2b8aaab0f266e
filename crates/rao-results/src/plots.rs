//! Charts as SVG text, drawn with plotters: axes with ticks and titles, legends in their own
//! panel beside the plot (never over the data), markers on lines so overlapping series stay
//! visible, and confidence intervals as whiskers on bars.

use plotters::prelude::*;

/// One colour per series name for a whole page, so a series looks the same in every chart.
pub struct Palette {
    names: Vec<String>,
}

/// Tableau 10: distinguishable, also in grey scale order.
const COLOURS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

impl Palette {
    pub fn new(names: impl IntoIterator<Item = String>) -> Self {
        let mut p = Palette { names: Vec::new() };
        for n in names {
            p.colour(&n);
        }
        p
    }
    /// `colour(name)` mixed halfway to white: the same hue, told apart (e.g. flat beside recursive).
    pub fn light(&mut self, name: &str) -> RGBColor {
        let RGBColor(r, g, b) = self.colour(name);
        let mix = |c: u8| ((c as u16 + 255) / 2) as u8;
        RGBColor(mix(r), mix(g), mix(b))
    }
    /// The colour of `name` (a new name takes the next free colour).
    pub fn colour(&mut self, name: &str) -> RGBColor {
        let i = match self.names.iter().position(|n| n == name) {
            Some(i) => i,
            None => {
                self.names.push(name.to_string());
                self.names.len() - 1
            }
        };
        COLOURS[i % COLOURS.len()]
    }
}

pub struct Size {
    pub width: u32,
    pub height: u32,
}

pub const WIDE: Size = Size { width: 760, height: 320 };
pub const HALF: Size = Size { width: 575, height: 300 };
pub const SMALL: Size = Size { width: 380, height: 230 };
const LEGEND_WIDTH: u32 = 170;

pub struct Line<'a> {
    pub name: &'a str,
    pub colour: RGBColor,
    pub points: Vec<(f64, f64)>,
}

pub struct Bars<'a> {
    pub name: &'a str,
    pub colour: RGBColor,
    /// One value per group (None: no bar).
    pub values: Vec<Option<f64>>,
    /// 95% interval per group, drawn as a whisker.
    pub intervals: Option<Vec<Option<(f64, f64)>>>,
}

pub struct Axes<'a> {
    pub title: &'a str,
    pub x: &'a str,
    pub y: &'a str,
}

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn range_of(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.filter(|v| v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    if hi - lo < 1e-12 {
        // A constant: 0 shows as the bottom of [0, 1], anything else in the middle of ±10%.
        return if lo.abs() < 1e-12 { (0.0, 1.0) } else { (lo - lo.abs() * 0.1, hi + lo.abs() * 0.1) };
    }
    let pad = (hi - lo) * 0.06;
    (lo - pad, hi + pad)
}

/// A tick label that stays short: 0.25, 1.2k, 3e-5.
fn tick(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1e4 {
        format!("{:.1}k", v / 1e3)
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.2}").trim_end_matches('0').trim_end_matches('.').to_string()
    } else if a >= 1e-3 {
        format!("{v:.3}").trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        format!("{v:.0e}")
    }
}

/// A legend in its own panel: a swatch and the name per series.
fn legend<DB: DrawingBackend>(area: &DrawingArea<DB, plotters::coord::Shift>, entries: &[(&str, RGBColor)]) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let mut y = 34;
    for (name, colour) in entries {
        area.draw(&Rectangle::new([(6, y - 5), (20, y + 5)], colour.filled()))?;
        // A long name goes on over more lines, never cut.
        for line in wrap(name, LEGEND_CHARS) {
            area.draw(&Text::new(line, (26, y - 7), ("sans-serif", 13).into_font()))?;
            y += 15;
        }
        y += 3;
    }
    Ok(())
}

/// Characters of a legend line (the panel's width at 13 px sans-serif).
const LEGEND_CHARS: usize = 21;

/// `text` in lines of at most `width` characters, broken at spaces (a longer word on its own).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in text.split(' ') {
        match lines.last_mut() {
            Some(line) if line.chars().count() + 1 + word.chars().count() <= width => {
                line.push(' ');
                line.push_str(word);
            }
            _ => {
                let chars: Vec<char> = word.chars().collect();
                lines.extend(chars.chunks(width.max(1)).map(|c| c.iter().collect::<String>()));
            }
        }
    }
    lines
}

/// Lines over a numeric x axis (e.g. iterations), with a marker at every point.
pub fn lines(axes: &Axes, size: &Size, series: &[Line]) -> String {
    lines_in(axes, size, series, None)
}

/// [`lines`] with a fixed y range (rates: 0 to 1), else one fitted to the points.
pub fn lines_in(axes: &Axes, size: &Size, series: &[Line], y_range: Option<(f64, f64)>) -> String {
    let mut svg = String::new();
    if let Err(e) = draw_lines(&mut svg, axes, size, series, y_range) {
        return error_note(axes.title, &e.to_string());
    }
    svg
}

fn draw_lines(svg: &mut String, axes: &Axes, size: &Size, series: &[Line], y_range: Option<(f64, f64)>) -> Result<()> {
    let root = SVGBackend::with_string(svg, (size.width, size.height)).into_drawing_area();
    root.fill(&WHITE)?;
    let with_legend = series.len() > 1;
    let (plot, side) = root.split_horizontally(size.width - if with_legend { LEGEND_WIDTH } else { 0 });
    let (x0, x1) = range_of(series.iter().flat_map(|s| s.points.iter().map(|p| p.0)));
    let (y0, y1) = y_range.unwrap_or_else(|| range_of(series.iter().flat_map(|s| s.points.iter().map(|p| p.1))));
    let mut chart = ChartBuilder::on(&plot)
        .caption(axes.title, ("sans-serif", 15))
        .margin(8)
        .x_label_area_size(38)
        .y_label_area_size(54)
        .build_cartesian_2d(x0..x1, y0..y1)?;
    chart
        .configure_mesh()
        .x_desc(axes.x)
        .y_desc(axes.y)
        .x_labels(8)
        .y_labels(6)
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .max_light_lines(1)
        .light_line_style(RGBColor(240, 240, 240))
        .label_style(("sans-serif", 12))
        .axis_desc_style(("sans-serif", 13))
        .draw()?;
    for s in series {
        if s.points.len() > SMOOTH_FROM {
            // Noisy per-iteration values: faint dots for each, a moving average as the line.
            let faint = s.colour.mix(0.35);
            chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 2, faint.filled())))?;
            chart.draw_series(LineSeries::new(moving_average(&s.points, SMOOTH_WINDOW), s.colour.stroke_width(2)))?;
        } else {
            chart.draw_series(LineSeries::new(s.points.iter().copied(), s.colour.stroke_width(2)))?;
            chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, s.colour.filled())))?;
        }
    }
    if with_legend {
        legend(&side, &series.iter().map(|s| (s.name, s.colour)).collect::<Vec<_>>())?;
    }
    root.present()?;
    Ok(())
}

/// Curves longer than this are drawn as a moving average over the raw points.
pub const SMOOTH_FROM: usize = 12;
pub const SMOOTH_WINDOW: usize = 5;

/// Trailing mean over the last `window` points (fewer at the start).
pub fn moving_average(points: &[(f64, f64)], window: usize) -> Vec<(f64, f64)> {
    (0..points.len())
        .map(|i| {
            let from = (i + 1).saturating_sub(window);
            let part = &points[from..=i];
            (points[i].0, part.iter().map(|p| p.1).sum::<f64>() / part.len() as f64)
        })
        .collect()
}

/// Grouped bars (one group per category, one bar per series) with optional 95% whiskers.
pub fn bars(axes: &Axes, size: &Size, groups: &[String], series: &[Bars], y_max: Option<f64>) -> String {
    let mut svg = String::new();
    if let Err(e) = draw_bars(&mut svg, axes, size, groups, series, y_max) {
        return error_note(axes.title, &e.to_string());
    }
    svg
}

fn draw_bars(svg: &mut String, axes: &Axes, size: &Size, groups: &[String], series: &[Bars], y_max: Option<f64>) -> Result<()> {
    let root = SVGBackend::with_string(svg, (size.width, size.height)).into_drawing_area();
    root.fill(&WHITE)?;
    let (plot, side) = root.split_horizontally(size.width - LEGEND_WIDTH);
    let n = groups.len().max(1);
    let top = y_max.unwrap_or_else(|| {
        let hi = series
            .iter()
            .flat_map(|s| {
                let whiskers = s.intervals.iter().flatten().flatten().map(|(_, hi)| *hi);
                s.values.iter().flatten().copied().chain(whiskers).collect::<Vec<_>>()
            })
            .fold(0.0f64, f64::max);
        if hi > 0.0 { hi * 1.1 } else { 1.0 }
    });
    let mut chart = ChartBuilder::on(&plot)
        .caption(axes.title, ("sans-serif", 15))
        .margin(8)
        .x_label_area_size(38)
        .y_label_area_size(54)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0.0..top)?;
    let names = groups.to_vec();
    let group_label = move |v: &f64| -> String {
        let i = v.round();
        if (v - i).abs() < 1e-6 && i >= 0.0 { names.get(i as usize).cloned().unwrap_or_default() } else { String::new() }
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc(axes.x)
        .y_desc(axes.y)
        .x_labels(n)
        .y_labels(6)
        .x_label_formatter(&group_label)
        .y_label_formatter(&|v| tick(*v))
        .max_light_lines(1)
        .light_line_style(RGBColor(240, 240, 240))
        .label_style(("sans-serif", 12))
        .axis_desc_style(("sans-serif", 13))
        .draw()?;
    let k = series.len().max(1) as f64;
    let width = 0.8 / k;
    for (j, s) in series.iter().enumerate() {
        let left = |g: usize| g as f64 - 0.4 + width * j as f64;
        chart.draw_series(s.values.iter().enumerate().filter_map(|(g, v)| {
            v.map(|v| Rectangle::new([(left(g) + width * 0.08, 0.0), (left(g) + width * 0.92, v)], s.colour.filled()))
        }))?;
        if let Some(ci) = &s.intervals {
            let whisker = RGBColor(40, 40, 40).stroke_width(1);
            chart.draw_series(ci.iter().enumerate().filter_map(|(g, iv)| {
                let (lo, hi) = (*iv)?;
                let x = left(g) + width / 2.0;
                Some(PathElement::new(vec![(x, lo), (x, hi)], whisker))
            }))?;
            for cap in [0usize, 1] {
                chart.draw_series(ci.iter().enumerate().filter_map(|(g, iv)| {
                    let (lo, hi) = (*iv)?;
                    let (x, y) = (left(g) + width / 2.0, if cap == 0 { lo } else { hi });
                    Some(PathElement::new(vec![(x - width * 0.2, y), (x + width * 0.2, y)], whisker))
                }))?;
            }
        }
    }
    legend(&side, &series.iter().map(|s| (s.name, s.colour)).collect::<Vec<_>>())?;
    root.present()?;
    Ok(())
}

fn error_note(title: &str, e: &str) -> String {
    format!("<p class='note'>{}: could not be drawn ({})</p>", crate::html::esc(title), crate::html::esc(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moving_average_trails_over_the_window() {
        let pts: Vec<(f64, f64)> = [1.0, 2.0, 3.0, 10.0].iter().enumerate().map(|(i, v)| (i as f64 + 1.0, *v)).collect();
        let ma = moving_average(&pts, 2);
        assert_eq!(ma, vec![(1.0, 1.0), (2.0, 1.5), (3.0, 2.5), (4.0, 6.5)]);
    }

    #[test]
    fn a_name_keeps_its_colour_and_its_light_shade_differs() {
        let mut p = Palette::new(["rao".to_string(), "warmstart".to_string()]);
        let rao = p.colour("rao");
        assert_eq!(p.colour("expert"), COLOURS[2]);
        assert_eq!(p.colour("rao"), rao);
        assert_ne!(p.light("rao"), rao);
    }

    #[test]
    fn charts_are_svg_with_axis_titles_and_a_legend() {
        let mut p = Palette::new([]);
        let axes = Axes { title: "T", x: "band", y: "success rate" };
        let bars = [
            Bars {
                name: "a · recursive",
                colour: p.colour("a"),
                values: vec![Some(0.5), None],
                intervals: Some(vec![Some((0.3, 0.7)), None]),
            },
            Bars { name: "a · flat", colour: p.light("a"), values: vec![Some(0.1), Some(0.2)], intervals: None },
        ];
        let svg = super::bars(&axes, &HALF, &["easy".into(), "hard".into()], &bars, Some(1.0));
        for must in ["<svg", "success rate", "band", "easy", "hard", "a · recursive", "a · flat"] {
            assert!(svg.contains(must), "{must}: {svg}");
        }
    }

    #[test]
    fn legends_wrap_long_names_instead_of_cutting_them() {
        assert_eq!(wrap("expert-deep · recursive · hard", 21), ["expert-deep ·", "recursive · hard"]);
        assert_eq!(wrap("a_very_long_metric_name_indeed", 21), ["a_very_long_metric_na", "me_indeed"]);
        let mut p = Palette::new([]);
        let lines: Vec<Line> = ["expert-deep · recursive", "rao · flat"]
            .iter()
            .map(|&name| Line { name, colour: p.colour(name), points: vec![(1.0, 0.5), (2.0, 1.0)] })
            .collect();
        let svg = super::lines_in(&Axes { title: "T", x: "iteration", y: "success" }, &SMALL, &lines, Some((0.0, 1.0)));
        assert!(svg.contains("expert-deep ·") && svg.contains("recursive") && !svg.contains('…'), "{svg}");
    }
}
