//! One SVG per scenario (plotters, SVG backend only): requests/s on top, the proxy's CPU per
//! request below (and the p99 latency for open-loop loads); one line per proxy across the
//! scenario's loads, with min–max error bars.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::load::Load;
use crate::runner::ScenarioResult;
use crate::stats::Spread;
use crate::summary::{Case, Summary};

/// Draws `s` into an SVG file at `path`.
pub fn write_svg(path: &Path, s: &ScenarioResult) -> Result<()> {
    // With a fixed offered rate (open loop) req/s says little: add the p99 latency.
    let open_loop = s.cases.iter().any(|c| matches!(c.load, Load::Rate { .. }));
    let rows = if open_loop { 3 } else { 2 };
    let root = SVGBackend::new(path, (960, 380 * rows as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e:?}"))?;
    let title = format!("{}: seed {}", s.scenario.name, s.scenario.seeds);
    let root = root
        .titled(&title, ("sans-serif", 22))
        .map_err(|e| anyhow!("{e:?}"))?;
    let panels = root.split_evenly((rows, 1));
    panel(&panels[0], "requests/s (median, min-max)", &s.cases, |x| {
        x.rps
    })?;
    panel(
        &panels[1],
        "proxy CPU per request, us (median, min-max)",
        &s.cases,
        |x| x.cpu_per_req_us,
    )?;
    if open_loop {
        panel(
            &panels[2],
            "p99 latency, us (median, min-max)",
            &s.cases,
            |x| x.p99_us,
        )?;
    }
    root.present().map_err(|e| anyhow!("{e:?}"))?;
    Ok(())
}

fn uniq<T: PartialEq + Clone>(it: impl Iterator<Item = T>) -> Vec<T> {
    let mut v = Vec::new();
    for x in it {
        if !v.contains(&x) {
            v.push(x);
        }
    }
    v
}

fn panel(
    area: &DrawingArea<SVGBackend, Shift>,
    caption: &str,
    cases: &[Case],
    metric: fn(&Summary) -> Option<Spread>,
) -> Result<()> {
    let labels = uniq(cases.iter().map(|c| c.label.clone()));
    let peers = uniq(cases.iter().map(|c| c.peer_name));
    let n = labels.len().max(1);
    let ymax = cases
        .iter()
        .filter_map(|c| metric(&c.summary))
        .map(|s| s.max)
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5f64..n as f64 - 0.5, 0f64..ymax)
        .map_err(|e| anyhow!("{e:?}"))?;
    // Loads are categories at x = 0, 1, ...: label the integer ticks only.
    let label_of = |x: &f64| {
        if (x - x.round()).abs() < 1e-6 && *x > -0.5 {
            labels.get(x.round() as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(4 * n + 1)
        .x_label_formatter(&label_of)
        .y_label_formatter(&|y: &f64| {
            if ymax >= 100.0 {
                format!("{y:.0}")
            } else {
                format!("{y:.1}")
            }
        })
        .light_line_style(WHITE)
        .draw()
        .map_err(|e| anyhow!("{e:?}"))?;
    let np = peers.len().max(1) as f64;
    for (i, peer) in peers.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        // Spread the proxies a little sideways so their error bars stay apart.
        let dx = (i as f64 - (np - 1.0) / 2.0) * (0.3 / np);
        let pts: Vec<(f64, Spread)> = labels
            .iter()
            .enumerate()
            .filter_map(|(j, l)| {
                let c = cases
                    .iter()
                    .find(|c| c.peer_name == *peer && &c.label == l)?;
                Some((j as f64 + dx, metric(&c.summary)?))
            })
            .collect();
        chart
            .draw_series(LineSeries::new(
                pts.iter().map(|(x, s)| (*x, s.median)),
                color.stroke_width(2),
            ))
            .map_err(|e| anyhow!("{e:?}"))?
            .label(*peer)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        chart
            .draw_series(
                pts.iter()
                    .map(|(x, s)| Circle::new((*x, s.median), 3, color.filled())),
            )
            .map_err(|e| anyhow!("{e:?}"))?;
        chart
            .draw_series(
                pts.iter()
                    .map(|(x, s)| ErrorBar::new_vertical(*x, s.min, s.median, s.max, color, 8)),
            )
            .map_err(|e| anyhow!("{e:?}"))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| anyhow!("{e:?}"))?;
    Ok(())
}
