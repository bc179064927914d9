//! `probe --plot FILE.svg`: what the search measured, to look at.
//!
//! Drawn with `plotters` and its SVG backend (no font rendering: text stays
//! SVG text). One chart per kind of run: peak memory against the batch (or
//! the input size under `--find`), the largest batch against the length
//! under `--seq-lens`, and bytes per sample and largest batch per variant
//! under `--compare`.

use std::path::Path;

use autobatch::{Plan, plan::LongestSize, plan::SizePlan, plan::Trial, search::Outcome};
use plotters::coord::Shift;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use crate::failure::Failure;

const SIZE: (u32, u32) = (960, 600);
const FITS: RGBColor = RGBColor(44, 160, 44);
const OVER: RGBColor = RGBColor(255, 127, 14);
const OOM: RGBColor = RGBColor(214, 39, 40);
const CEILING: RGBColor = RGBColor(214, 39, 40);
const MODEL: RGBColor = RGBColor(31, 119, 180);
const CHOSEN: RGBColor = RGBColor(148, 103, 189);

/// Bytes in the unit a chart's memory axis uses: MiB below 4 GiB, GiB above.
#[derive(Clone, Copy)]
struct Unit {
    name: &'static str,
    bytes: f64,
}

impl Unit {
    fn for_capacity(capacity_bytes: u64) -> Unit {
        if capacity_bytes >= 4 << 30 {
            Unit { name: "GiB", bytes: (1u64 << 30) as f64 }
        } else {
            Unit { name: "MiB", bytes: (1u64 << 20) as f64 }
        }
    }

    fn of(self, bytes: f64) -> f64 {
        bytes / self.bytes
    }
}

/// One measured step: where it sits on the chart and how it ended.
struct Point {
    x: usize,
    peak_bytes: Option<u64>,
    outcome: Outcome,
}

/// What a peak-against-x chart shows.
struct PeakChart<'a> {
    title: &'a str,
    x_label: &'a str,
    points: Vec<Point>,
    limit_bytes: u64,
    capacity_bytes: u64,
    ceiling: autobatch::plan::Ceiling,
    chosen: usize,
    /// The fitted phases' lines (bytes at 0 and per unit of x), the peak
    /// the largest of them, when there are any.
    line: Option<Vec<(f64, f64)>>,
}

/// An axis of counts (a batch, a length, sequences): drawn in `f64` (a line
/// runs between counts) and ticked at integers alone ([`integer_ticks`]).
struct CountAxis {
    range: RangedCoordf64,
    ticks: Vec<f64>,
}

impl CountAxis {
    /// From 0 to `top`.
    fn to(top: f64) -> CountAxis {
        CountAxis { range: (0f64..top).into(), ticks: integer_ticks(top) }
    }
}

impl Ranged for CountAxis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.range.map(value, limit)
    }

    /// The integer ticks; no light mesh lines between them.
    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() { Vec::new() } else { self.ticks.clone() }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.range.range()
    }
}

/// Ticks of a count's axis from 0 to `top`: integers only, a step of 1, 2
/// or 5 times a power of ten, at most 11 of them, so that no two ticks read
/// the same number.
fn integer_ticks(top: f64) -> Vec<f64> {
    let wanted = (top / 8.0).max(1.0);
    let magnitude = 10f64.powf(wanted.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * magnitude).find(|&step| step >= wanted).unwrap_or(wanted);
    let step = step.round().max(1.0);
    (0..).map(|i| i as f64 * step).take_while(|&tick| tick <= top).collect()
}

/// The top of a y axis whose data reach `data_top`, with room above it for
/// a legend of `entries` rows in a plot `plot_height` pixels tall, so that
/// the legend covers no line and no point.
fn above_legend(data_top: f64, entries: usize, plot_height: u32) -> f64 {
    // plotters' legend: 15 pixels a row and its box's margins, and a little room
    let legend = (16 * entries + 24) as f64;
    let free = (1.0 - legend / plot_height as f64).max(0.3);
    data_top / free
}

/// The height of the plotting area of a chart of `SIZE` with a caption: what
/// the margins, the caption and the x axis's labels leave.
const PLOT_HEIGHT: u32 = SIZE.1 - 2 * 16 - 44 - 30;

fn failed(path: &Path, err: impl std::fmt::Display) -> Failure {
    Failure::runtime(format!("--plot {}: could not draw the chart: {err}", path.display()))
}

/// A chart drawn by `draw` into memory, then written to `path` as the tool
/// writes every file (`paths::write_replacing`): marked as autobatch's, whole
/// or not at all.
fn svg_file(
    path: &Path,
    size: (u32, u32),
    draw: impl FnOnce(&DrawingArea<SVGBackend<'_>, Shift>) -> Result<(), Box<dyn std::error::Error>>,
) -> Result<(), Failure> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        draw(&root).map_err(|err| failed(path, err))?;
        root.present().map_err(|err| failed(path, err))?;
    }
    let marked = format!("{}\n{svg}", crate::paths::CHART_MARK);
    crate::paths::write_replacing(path, marked.as_bytes())
        .map_err(|err| Failure::runtime(format!("--plot {}: could not write the chart: {err}", path.display())))
}

/// `probe --plot`: every trial's peak against its batch.
pub fn plan(path: &Path, title: &str, plan: &Plan) -> Result<(), Failure> {
    let line = plan.memory_model().map(|model| match &model.phases[..] {
        [] if model.plateau_bytes > 0.0 => {
            vec![(model.plateau_bytes, 0.0), (model.fixed_bytes, model.bytes_per_sample)]
        }
        [] => vec![(model.fixed_bytes, model.bytes_per_sample)],
        phases => phases.iter().map(|phase| (phase.fixed_bytes, phase.bytes_per_sample)).collect(),
    });
    peaks(
        path,
        PeakChart {
            title,
            x_label: "batch",
            points: points(plan.trials()),
            limit_bytes: plan.limit_bytes(),
            capacity_bytes: plan.capacity_bytes(),
            ceiling: plan.ceiling(),
            chosen: plan.largest_batch(),
            line,
        },
    )
}

/// `probe --find --plot`: every trial's peak against its input size.
pub fn longest(path: &Path, title: &str, what: &str, longest: &LongestSize) -> Result<(), Failure> {
    let points = longest
        .trials
        .iter()
        .filter_map(|t| Some(Point { x: t.size?, peak_bytes: t.peak_bytes, outcome: t.outcome }))
        .collect();
    peaks(
        path,
        PeakChart {
            title,
            x_label: what,
            points,
            limit_bytes: longest.limit_bytes(),
            capacity_bytes: longest.capacity_bytes,
            ceiling: longest.ceiling,
            chosen: longest.largest_size,
            line: None,
        },
    )
}

/// The fitting steps' (x, peak) points.
fn fitting(points: &[Point]) -> Vec<(f64, f64)> {
    points.iter().filter(|p| p.outcome.fits()).filter_map(|p| Some((p.x as f64, p.peak_bytes? as f64))).collect()
}

/// The least-squares parabola `a + b·x + c·x²` through the fitting steps
/// (three or more at distinct x), by the normal equations.
fn quadratic_fit(points: &[Point]) -> Option<[f64; 3]> {
    let points = fitting(points);
    let mut xs: Vec<u64> = points.iter().map(|&(x, _)| x as u64).collect();
    xs.sort_unstable();
    xs.dedup();
    if xs.len() < 3 {
        return None;
    }
    // scale x to about 1 so that the sums stay well conditioned
    let scale = points.iter().map(|&(x, _)| x).fold(1.0, f64::max);
    let mut m = [[0.0f64; 4]; 3];
    for &(x, y) in &points {
        let t = x / scale;
        let powers = [1.0, t, t * t];
        for row in 0..3 {
            for col in 0..3 {
                m[row][col] += powers[row] * powers[col];
            }
            m[row][3] += powers[row] * y;
        }
    }
    for pivot in 0..3 {
        let best = (pivot..3).max_by(|&a, &b| m[a][pivot].abs().total_cmp(&m[b][pivot].abs()))?;
        m.swap(pivot, best);
        if m[pivot][pivot].abs() < 1e-12 {
            return None;
        }
        let pivot_row = m[pivot];
        for (_, row) in m.iter_mut().enumerate().filter(|(index, _)| *index != pivot) {
            let factor = row[pivot] / pivot_row[pivot];
            for (value, above) in row.iter_mut().zip(pivot_row).skip(pivot) {
                *value -= factor * above;
            }
        }
    }
    let [a, b, c] = [0, 1, 2].map(|i| m[i][3] / m[i][i]);
    let fit = [a, b / scale, c / (scale * scale)];
    fit.iter().all(|v| v.is_finite()).then_some(fit)
}

fn points(trials: &[Trial]) -> Vec<Point> {
    trials.iter().map(|t| Point { x: t.batch, peak_bytes: t.peak_bytes, outcome: t.outcome }).collect()
}

fn peaks(path: &Path, chart: PeakChart<'_>) -> Result<(), Failure> {
    svg_file(path, SIZE, |root| draw_peaks(root, &chart))
}

fn draw_peaks(
    root: &DrawingArea<SVGBackend<'_>, Shift>,
    chart: &PeakChart<'_>,
) -> Result<(), Box<dyn std::error::Error>> {
    root.fill(&WHITE)?;
    let unit = Unit::for_capacity(chart.capacity_bytes);
    let capacity = unit.of(chart.capacity_bytes as f64);
    let x_max = (chart.points.iter().map(|p| p.x).max().unwrap_or(1).max(chart.chosen) as f64 * 1.08 + 1.0).ceil();
    let data_top = memory_top(unit, capacity, chart.points.iter().filter_map(|p| p.peak_bytes));
    let outcomes = [Outcome::Fits, Outcome::OverCeiling, Outcome::OutOfMemory];
    let shown = outcomes.iter().filter(|&&o| chart.points.iter().any(|p| p.outcome == o)).count();
    let model_shown = chart.line.is_some() || quadratic_fit(&chart.points).is_some();
    // capacity, ceiling, the model, the answer and each outcome shown
    let y_max = above_legend(data_top, 3 + usize::from(model_shown) + shown, PLOT_HEIGHT);
    let y_desc = format!("peak memory ({})", unit.name);
    let mut plot = memory_axes(root, chart.title, chart.x_label, &y_desc, (x_max, y_max))?;
    let capacity_label = format!("capacity {}", autobatch::Bytes(chart.capacity_bytes));
    level(&mut plot, capacity, x_max, None, BLACK, capacity_label)?;
    let ceiling_label = format!("ceiling {} = {}", chart.ceiling, autobatch::Bytes(chart.limit_bytes));
    level(&mut plot, unit.of(chart.limit_bytes as f64), x_max, Some((8, 5)), CEILING, ceiling_label)?;
    // nothing above the data's top: the legend's room
    draw_memory_model(&mut plot, chart, unit, (x_max, data_top))?;
    chosen(&mut plot, chart.chosen as f64, data_top, format!("chosen: {} {}", chart.x_label, chart.chosen))?;

    let at = |p: &Point| (p.x as f64, p.peak_bytes.map_or(capacity, |b| unit.of(b as f64)).min(data_top));
    let of = |outcome: Outcome| chart.points.iter().filter(move |p| p.outcome == outcome);
    // a mark in the legend only for what happened
    if of(Outcome::Fits).next().is_some() {
        plot.draw_series(of(Outcome::Fits).map(|p| Circle::new(at(p), 5, FITS.filled())))?
            .label("fits")
            .legend(|(x, y)| Circle::new((x + 10, y), 5, FITS.filled()));
    }
    if of(Outcome::OverCeiling).next().is_some() {
        plot.draw_series(of(Outcome::OverCeiling).map(|p| TriangleMarker::new(at(p), 7, OVER.filled())))?
            .label("over the ceiling")
            .legend(|(x, y)| TriangleMarker::new((x + 10, y), 7, OVER.filled()));
    }
    if of(Outcome::OutOfMemory).next().is_some() {
        plot.draw_series(of(Outcome::OutOfMemory).map(|p| Cross::new(at(p), 6, OOM.stroke_width(3))))?
            .label("out of memory (drawn at its peak, or at the capacity when none was read)")
            .legend(|(x, y)| Cross::new((x + 10, y), 6, OOM.stroke_width(3)));
    }
    legend(&mut plot, SeriesLabelPosition::UpperLeft)
}

/// The top of a memory axis (in `unit`) over `peaks`: the highest, at
/// least the capacity (where a step without a peak is drawn), and a peak far
/// over the ceiling cut at twice the capacity.
fn memory_top(unit: Unit, capacity: f64, peaks: impl Iterator<Item = u64>) -> f64 {
    let highest = peaks.map(|bytes| unit.of(bytes as f64)).fold(capacity, f64::max);
    highest.min(2.0 * capacity) * 1.06
}

/// A chart of memory (in a [`Unit`]) against a count, ticked at integers.
type MemoryChart<'a> = ChartContext<'a, SVGBackend<'a>, Cartesian2d<CountAxis, RangedCoordf64>>;

/// The axes the peak and serving charts share: memory up to `y_max`
/// against a count up to `x_max`.
fn memory_axes<'a>(
    root: &DrawingArea<SVGBackend<'a>, Shift>,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    (x_max, y_max): (f64, f64),
) -> Result<MemoryChart<'a>, Box<dyn std::error::Error>> {
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 15))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d(CountAxis::to(x_max), 0f64..y_max)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| if y_max >= 20.0 { format!("{y:.0}") } else { format!("{y:.1}") })
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    Ok(chart)
}

/// A level across the chart (the capacity, the ceiling), solid or with
/// `dashes` (dash, gap), in the legend as `label`.
fn level(
    chart: &mut MemoryChart<'_>,
    y: f64,
    x_max: f64,
    dashes: Option<(u32, u32)>,
    color: RGBColor,
    label: String,
) -> Result<(), Box<dyn std::error::Error>> {
    let line = [(0.0, y), (x_max, y)];
    let style = color.stroke_width(2);
    let drawn = match dashes {
        Some((dash, gap)) => chart.draw_series(DashedLineSeries::new(line, dash, gap, style))?,
        None => chart.draw_series(LineSeries::new(line, style))?,
    };
    drawn.label(label).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    Ok(())
}

/// The answer, a dashed line up to `top`.
fn chosen(chart: &mut MemoryChart<'_>, x: f64, top: f64, label: String) -> Result<(), Box<dyn std::error::Error>> {
    chart
        .draw_series(DashedLineSeries::new([(x, 0.0), (x, top)], 4, 4, CHOSEN.stroke_width(1)))?
        .label(label)
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], CHOSEN.stroke_width(1)));
    Ok(())
}

/// The search's memory model (the largest of its phases' lines), or a quadratic through the
/// fitting steps where it had none.
fn draw_memory_model(
    plot: &mut MemoryChart<'_>,
    chart: &PeakChart<'_>,
    unit: Unit,
    (x_max, y_max): (f64, f64),
) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(lines) = &chart.line {
        let at = |x: f64| unit.of(lines.iter().map(|&(fixed, per_unit)| fixed + per_unit * x).fold(f64::MIN, f64::max));
        // the largest of the lines, up to the data's top (the legend's room is above it)
        let curve = (0..=400).map(|i| x_max * i as f64 / 400.0).map(|x| (x, at(x)));
        let inside: Vec<(f64, f64)> = curve.take_while(|&(_, y)| y <= y_max).collect();
        let said: Vec<String> = lines
            .iter()
            .map(|&(fixed, per_unit)| match per_unit {
                0.0 => format!("{} flat", autobatch::Bytes(fixed.max(0.0) as u64)),
                _ => format!(
                    "{} + {} per sample",
                    autobatch::Bytes(fixed.max(0.0) as u64),
                    autobatch::Bytes(per_unit.max(0.0) as u64)
                ),
            })
            .collect();
        // one line, or the largest of the phases' lines: the first, then the next past its crossover
        let label = format!("memory model: {}", said.join(", then "));
        plot.draw_series(LineSeries::new(inside, MODEL.stroke_width(1)))?
            .label(label)
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], MODEL.stroke_width(1)));
    } else if let Some([a, b, c]) = quadratic_fit(&chart.points) {
        let curve = (0..=200).map(|i| x_max * i as f64 / 200.0).map(|x| (x, unit.of(a + b * x + c * x * x)));
        let inside: Vec<(f64, f64)> = curve.filter(|&(_, y)| (0.0..=y_max).contains(&y)).collect();
        plot.draw_series(LineSeries::new(inside, MODEL.stroke_width(1)))?
            .label(format!("fitted: a + b·x + c·x² through the {} fitting steps", fitting(&chart.points).len()))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], MODEL.stroke_width(1)));
    }
    Ok(())
}

/// The legend of every labelled series, in a light box at `position`.
fn legend<'a, X: Ranged, Y: Ranged>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    position: SeriesLabelPosition,
) -> Result<(), Box<dyn std::error::Error>> {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK.mix(0.4))
        .draw()?;
    Ok(())
}

/// `probe --seq-lens --plot`: the largest batch against the length, verified
/// and predicted, and the token budget's curve.
pub fn sizes(path: &Path, title: &str, plan: &SizePlan) -> Result<(), Failure> {
    svg_file(path, SIZE, |root| draw_sizes(root, title, plan))
}

fn draw_sizes(
    root: &DrawingArea<SVGBackend<'_>, Shift>,
    title: &str,
    plan: &SizePlan,
) -> Result<(), Box<dyn std::error::Error>> {
    root.fill(&WHITE)?;
    let longest = plan.sizes.keys().copied().max().unwrap_or(1);
    let shortest = plan.sizes.keys().copied().min().unwrap_or(1);
    let most = plan.sizes.values().map(|plan| plan.largest_batch()).max().unwrap_or(1);
    let (x_max, y_max) = ((longest as f64 * 1.05).ceil(), above_legend(most as f64 * 1.05, 3, PLOT_HEIGHT).ceil());
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 15))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(CountAxis::to(x_max), CountAxis::to(y_max))?;
    chart
        .configure_mesh()
        .x_desc("sequence length")
        .y_desc("largest batch")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()?;
    let from = (shortest / 2).max(1);
    let budget: Vec<(f64, f64)> = (from..=longest)
        .map(|len| (len as f64, (plan.token_budget / len) as f64))
        .filter(|&(_, b)| b <= most as f64 * 1.05)
        .collect();
    chart
        .draw_series(DashedLineSeries::new(budget, 6, 4, OVER.stroke_width(2)))?
        .label(format!("token budget: {} tokens per micro-batch", plan.token_budget))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], OVER.stroke_width(2)));
    let predicted: Vec<(f64, f64)> =
        (shortest..=longest).filter_map(|len| plan.batch_for(len).ok().map(|b| (len as f64, b.batch as f64))).collect();
    chart
        .draw_series(LineSeries::new(predicted, MODEL.stroke_width(2)))?
        .label("predicted between probed lengths")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], MODEL.stroke_width(2)));
    chart
        .draw_series(
            plan.sizes
                .iter()
                .map(|(&size, plan)| Circle::new((size as f64, plan.largest_batch() as f64), 6, FITS.filled())),
        )?
        .label("verified (probed)")
        .legend(|(x, y)| Circle::new((x + 10, y), 6, FITS.filled()));
    legend(&mut chart, SeriesLabelPosition::UpperRight)
}

/// One variant of `--compare`: its name, largest batch, measured and
/// estimated bytes per sample.
pub struct VariantBar {
    pub name: String,
    pub largest_batch: usize,
    pub bytes_per_sample: Option<f64>,
    pub estimated_bytes_per_sample: Option<f64>,
}

/// `probe --compare --plot`: largest batch and bytes per sample per variant.
pub fn compare(path: &Path, title: &str, variants: &[VariantBar]) -> Result<(), Failure> {
    svg_file(path, (SIZE.0 + 240, SIZE.1), |root| draw_compare(root, title, variants))
}

fn draw_compare(
    root: &DrawingArea<SVGBackend<'_>, Shift>,
    title: &str,
    variants: &[VariantBar],
) -> Result<(), Box<dyn std::error::Error>> {
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 17))?;
    let (left, right) = root.split_horizontally(root.dim_in_pixel().0 / 2);
    let rows = Rows { variants };
    draw_batch_bars(&left, &rows)?;
    draw_byte_bars(&right, &rows)
}

/// The variants as rows of bars, the first on top, one empty row above
/// them for the legend.
struct Rows<'v> {
    variants: &'v [VariantBar],
}

impl Rows<'_> {
    /// Rows on the y axis: one a variant, and the legend's.
    fn count(&self) -> usize {
        self.variants.len() + 1
    }

    /// The y axis row of variant `index`: the first on top.
    fn row(&self, index: usize) -> usize {
        self.variants.len() - 1 - index
    }

    /// Each row's name where the y axis labels it.
    fn label(&self, value: &SegmentValue<usize>) -> String {
        match value {
            SegmentValue::CenterOf(row) if *row < self.variants.len() => {
                self.variants[self.variants.len() - 1 - row].name.clone()
            }
            _ => String::new(),
        }
    }

    /// The labels' room from the longest one (about 7 pixels a character at
    /// the mesh's 12-pixel font), so that none is cut at the chart's edge.
    fn label_room(&self) -> u32 {
        let longest = self.variants.iter().map(|v| v.name.chars().count()).max().unwrap_or(0) as u32;
        (7 * longest + 24).max(80)
    }

    /// Variant `index`'s bar from 0 to `value`.
    fn bar<X: Clone>(&self, index: usize, zero: X, value: X, style: ShapeStyle) -> Rectangle<(X, SegmentValue<usize>)> {
        let corners = [(zero, SegmentValue::Exact(self.row(index))), (value, SegmentValue::Exact(self.row(index) + 1))];
        let mut bar = Rectangle::new(corners, style);
        bar.set_margin(6, 6, 0, 0);
        bar
    }
}

/// The left half of `--compare`'s chart: each variant's largest batch.
fn draw_batch_bars(area: &DrawingArea<SVGBackend<'_>, Shift>, rows: &Rows) -> Result<(), Box<dyn std::error::Error>> {
    let most = rows.variants.iter().map(|v| v.largest_batch).max().unwrap_or(1).max(1);
    let mut batches = ChartBuilder::on(area)
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(rows.label_room())
        .caption("largest batch", ("sans-serif", 15))
        .build_cartesian_2d(0usize..most + most / 8 + 1, (0..rows.count()).into_segmented())?;
    batches
        .configure_mesh()
        .y_label_formatter(&|value| rows.label(value))
        .y_labels(rows.count())
        .x_labels(6)
        .x_desc("samples")
        .disable_y_mesh()
        .draw()?;
    batches
        .draw_series(rows.variants.iter().enumerate().map(|(i, v)| rows.bar(i, 0, v.largest_batch, FITS.filled())))?;
    Ok(())
}

/// The right half of `--compare`'s chart: each variant's bytes per sample,
/// measured, and what the estimate expected from the first row's.
fn draw_byte_bars(area: &DrawingArea<SVGBackend<'_>, Shift>, rows: &Rows) -> Result<(), Box<dyn std::error::Error>> {
    let kib = Unit { name: "KiB", bytes: 1024.0 };
    let variants = rows.variants;
    let widest =
        variants.iter().flat_map(|v| [v.bytes_per_sample, v.estimated_bytes_per_sample]).flatten().fold(1.0, f64::max);
    let mut bytes = ChartBuilder::on(area)
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(rows.label_room())
        .caption("bytes per sample", ("sans-serif", 15))
        .build_cartesian_2d(0f64..kib.of(widest) * 1.15, (0..rows.count()).into_segmented())?;
    bytes
        .configure_mesh()
        .y_label_formatter(&|value| rows.label(value))
        .y_labels(rows.count())
        .x_labels(5)
        .x_label_formatter(&|value| format!("{value:.0}"))
        .x_desc(format!("per sample ({})", kib.name))
        .disable_y_mesh()
        .draw()?;
    let measured = variants
        .iter()
        .enumerate()
        .filter_map(|(i, v)| Some(rows.bar(i, 0.0, kib.of(v.bytes_per_sample?), MODEL.mix(0.8).filled())));
    bytes
        .draw_series(measured)?
        .label("measured")
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], MODEL.mix(0.8).filled()));
    bytes
        .draw_series(variants.iter().enumerate().filter_map(|(i, v)| {
            let value = kib.of(v.estimated_bytes_per_sample?);
            Some(Cross::new((value, SegmentValue::CenterOf(rows.row(i))), 7, OOM.stroke_width(3)))
        }))?
        .label("estimated from the first row")
        .legend(|(x, y)| Cross::new((x + 8, y), 6, OOM.stroke_width(3)));
    legend(&mut bytes, SeriesLabelPosition::UpperRight)
}

/// `serve --plot`: memory against the sequences in flight: what was held
/// before the trials, the caches and the worst step's own bytes as counted
/// (stacked), the peaks measured, the limit and the answer.
pub fn serving(
    path: &Path,
    title: &str,
    plan: &autobatch::serve::ServePlan,
    counted: &autobatch_models::ServingBytes,
) -> Result<(), Failure> {
    svg_file(path, SIZE, |root| draw_serving(root, title, plan, counted))
}

fn draw_serving(
    root: &DrawingArea<SVGBackend<'_>, Shift>,
    title: &str,
    plan: &autobatch::serve::ServePlan,
    counted: &autobatch_models::ServingBytes,
) -> Result<(), Box<dyn std::error::Error>> {
    root.fill(&WHITE)?;
    let unit = Unit::for_capacity(plan.capacity_bytes);
    let capacity = unit.of(plan.capacity_bytes as f64);
    let x_max =
        (plan.trials.iter().map(|t| t.number).max().unwrap_or(1).max(plan.max_sequences) as f64 * 1.1 + 1.0).ceil();
    let data_top = memory_top(unit, capacity, plan.trials.iter().filter_map(|t| t.peak_bytes));
    // three bands, the limit, the answer, and one or two kinds of peak
    let y_max = above_legend(data_top, 6 + usize::from(plan.trials.iter().any(|t| !t.fits)), PLOT_HEIGHT);
    let x_desc = format!("sequences of {} tokens", plan.context);
    let mut chart = memory_axes(root, title, &x_desc, &format!("memory ({})", unit.name), (x_max, y_max))?;
    draw_serving_bands(&mut chart, plan, counted, unit, (x_max, data_top))?;
    let limit_label = format!("limit {}", autobatch::Bytes(plan.limit_bytes));
    level(&mut chart, unit.of(plan.limit_bytes as f64), x_max, Some((8, 5)), CEILING, limit_label)?;
    chosen(&mut chart, plan.max_sequences as f64, data_top, format!("largest: {} sequences", plan.max_sequences))?;
    let at = |t: &autobatch::serve::ServeTrial| {
        (t.number as f64, t.peak_bytes.map_or(capacity, |b| unit.of(b as f64)).min(data_top))
    };
    chart
        .draw_series(plan.trials.iter().filter(|t| t.fits).map(|t| Circle::new(at(t), 5, FITS.filled())))?
        .label("measured peak: fits")
        .legend(|(x, y)| Circle::new((x + 10, y), 5, FITS.filled()));
    if plan.trials.iter().any(|t| !t.fits) {
        chart
            .draw_series(plan.trials.iter().filter(|t| !t.fits).map(|t| TriangleMarker::new(at(t), 7, OVER.filled())))?
            .label("measured peak: does not fit")
            .legend(|(x, y)| TriangleMarker::new((x + 10, y), 7, OVER.filled()));
    }
    legend(&mut chart, SeriesLabelPosition::UpperLeft)
}

/// What the count says the memory holds, in bands from the axis up: what
/// was held before the trials, the caches, the worst step's own bytes.
fn draw_serving_bands(
    chart: &mut MemoryChart<'_>,
    plan: &autobatch::serve::ServePlan,
    counted: &autobatch_models::ServingBytes,
    unit: Unit,
    (x_max, y_max): (f64, f64),
) -> Result<(), Box<dyn std::error::Error>> {
    let xs: Vec<f64> = (0..=200).map(|i| x_max * i as f64 / 200.0).collect();
    let held = unit.of(plan.held_bytes as f64);
    let caches = |x: f64| held + unit.of(counted.cache_bytes_per_sequence as f64 * x);
    let step = |x: f64| caches(x) + unit.of(counted.step_bytes_at(x.round().max(1.0) as usize) as f64);
    // a band from the axis up to `top`, filled (plotters' Polygon: no area-series feature needed)
    let band = |top: &dyn Fn(f64) -> f64| {
        let mut outline: Vec<(f64, f64)> = xs.iter().map(|&x| (x, top(x).min(y_max))).collect();
        outline.extend([(x_max, 0.0), (0.0, 0.0)]);
        outline
    };
    // opaque, drawn from the top band down: each band shows between its neighbours
    const HELD: RGBColor = RGBColor(205, 205, 205);
    const STEP: RGBColor = RGBColor(255, 204, 153);
    const CACHES: RGBColor = RGBColor(158, 196, 230);
    let bands = [
        (band(&step), STEP, "the worst step's own bytes (counted)".to_owned()),
        (
            band(&caches),
            CACHES,
            format!("KV caches: {} a sequence", autobatch::Bytes(counted.cache_bytes_per_sequence)),
        ),
        (band(&|_| held), HELD, format!("held before the trials (weights {})", autobatch::Bytes(counted.weight_bytes))),
    ];
    for (outline, color, label) in bands {
        chart
            .draw_series(std::iter::once(Polygon::new(outline, color.filled())))?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 20, y + 5)], color.filled()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whatever the axis's length: integers from 0, rising, at most 11,
    /// and at least two past a length of 1.
    #[test]
    fn a_count_axis_is_ticked_at_distinct_integers() {
        for top in (1..2000).map(f64::from).chain([2.16, 4.3, 12_345.0, 1e9]) {
            let ticks = integer_ticks(top);
            assert_eq!(ticks[0], 0.0, "{top}");
            assert!(ticks.len() <= 11 && (top < 2.0 || ticks.len() >= 2), "{top}: {ticks:?}");
            assert!(ticks.iter().all(|t| t.fract() == 0.0 && *t <= top), "{top}: {ticks:?}");
            assert!(ticks.windows(2).all(|w| w[0] < w[1]), "{top}: {ticks:?}");
        }
    }
}
