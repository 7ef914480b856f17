//! This module owns the benchmark's picture: time per phase (the baseline,
//! each step, the whole walk, one hop) against data size (the db file's
//! MiB, so sizes made of many small or fewer large values line up), ours
//! beside the floor, on log-log axes, as an SVG. It reads the figures the benchmark wrote, one
//! row per (data size, phase):
//!
//! ```text
//! keys,value_bytes,db_mib,phase,ours_s,floor_s
//! 200000,1024,508,step 3.4.23,2.9,2.0
//! ```
//!
//! Usage: `cargo run --release --example plot -- <figures.csv> <out.svg> [title]`

use std::collections::BTreeMap;
use std::error::Error;
use std::path::Path;

use plotters::prelude::*;

/// One measured row.
struct Row {
    db_mib: f64,
    phase: String,
    ours: f64,
    floor: f64,
}

fn parse(path: &Path) -> Result<Vec<Row>, Box<dyn Error>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the figures {}: {e}", path.display()))?;
    let mut rows = Vec::new();
    for (n, line) in text.lines().enumerate().skip(1) {
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let [_keys, _value_bytes, db_mib, phase, ours, floor] = fields[..] else {
            return Err(format!(
                "{}:{}: want 6 fields (keys,value_bytes,db_mib,phase,ours_s,floor_s), got {line:?}",
                path.display(),
                n + 1
            )
            .into());
        };
        let number = |what: &str, text: &str| -> Result<f64, Box<dyn Error>> {
            text.parse::<f64>()
                .map_err(|e| format!("{}:{}: {what} {text:?}: {e}", path.display(), n + 1).into())
        };
        rows.push(Row {
            db_mib: number("db_mib", db_mib)?,
            phase: phase.to_string(),
            ours: number("ours_s", ours)?,
            floor: number("floor_s", floor)?,
        });
    }
    if rows.is_empty() {
        return Err(format!("{} holds no figures", path.display()).into());
    }
    Ok(rows)
}

/// A log axis range that holds every value with some room.
fn span(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    (lo / 1.6).max(1e-3)..hi * 1.6
}

/// 1763 → "1.7 GiB", 131 → "131 MiB".
fn human(mib: f64) -> String {
    if mib >= 1024.0 {
        format!("{:.1} GiB", mib / 1024.0)
    } else {
        format!("{mib:.0} MiB")
    }
}

fn draw(rows: &[Row], out: &Path, title: &str) -> Result<(), Box<dyn Error>> {
    let mut phases: BTreeMap<&str, Vec<&Row>> = BTreeMap::new();
    for row in rows {
        phases.entry(row.phase.as_str()).or_default().push(row);
    }
    let root = SVGBackend::new(out, (960, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let x = span(rows.iter().map(|r| r.db_mib));
    let y = span(rows.iter().flat_map(|r| [r.ours, r.floor]));
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(x.log_scale(), y.log_scale())?;
    chart
        .configure_mesh()
        .x_desc("db size (log)")
        .y_desc("seconds (log)")
        .x_labels(8)
        .y_labels(8)
        .x_label_formatter(&|v| human(*v))
        .y_label_formatter(&|v| format!("{v}"))
        .light_line_style(WHITE)
        .draw()?;
    for (i, (phase, mut points)) in phases.into_iter().enumerate() {
        points.sort_by(|a, b| a.db_mib.total_cmp(&b.db_mib));
        let color = Palette99::pick(i).to_rgba();
        let ours: Vec<(f64, f64)> = points.iter().map(|r| (r.db_mib, r.ours)).collect();
        let floor: Vec<(f64, f64)> = points.iter().map(|r| (r.db_mib, r.floor)).collect();
        chart
            .draw_series(LineSeries::new(ours.clone(), color.stroke_width(2)))?
            .label(format!("{phase}: etcd-migrate"))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(ours.iter().map(|p| Circle::new(*p, 4, color.filled())))?;
        chart
            .draw_series(LineSeries::new(
                floor.clone(),
                color.mix(0.5).stroke_width(1),
            ))?
            .label(format!("{phase}: floor"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.mix(0.5)));
        chart.draw_series(
            floor
                .iter()
                .map(|p| TriangleMarker::new(*p, 5, color.mix(0.5).stroke_width(1))),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(input), Some(output)) = (args.first(), args.get(1)) else {
        return Err("usage: plot <figures.csv> <out.svg> [title]".into());
    };
    let title = args
        .get(2)
        .map_or("time per phase against data size", String::as_str);
    let rows = parse(Path::new(input))?;
    draw(&rows, Path::new(output), title)?;
    eprintln!("plot: {} rows -> {output}", rows.len());
    Ok(())
}
