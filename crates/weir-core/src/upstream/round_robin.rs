//! Round robin over a pool's servers, one cursor per worker.

/// Picks the next server index from `count` servers and advances `cursor`.
pub fn pick(cursor: &mut usize, count: usize) -> Option<usize> {
    if count == 0 {
        return None;
    }
    let i = *cursor % count;
    *cursor = cursor.wrapping_add(1);
    Some(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cycles_evenly() {
        let mut cursor = 0;
        let picks: Vec<_> = (0..6).map(|_| pick(&mut cursor, 3).unwrap()).collect();
        assert_eq!(picks, vec![0, 1, 2, 0, 1, 2]);
        assert_eq!(pick(&mut cursor, 0), None);
    }
}
