//! Aligned text tables for people (`-o json` is for scripts).

/// Renders `rows` under `header`, columns padded to their widest cell.
pub fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        padded.join("  ").trim_end().to_string()
    };
    let mut out = line(header.to_vec());
    out.push('\n');
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn pads_columns() {
        let t = super::render(
            &["NAME", "N"],
            &[
                vec!["a".into(), "10".into()],
                vec!["long".into(), "1".into()],
            ],
        );
        assert_eq!(t, "NAME  N\na     10\nlong  1\n");
    }
}
