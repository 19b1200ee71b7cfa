//! Round robin: members in turn, each equally, skipping unavailable ones. One cursor per
//! worker and group; O(1) when the next member is available.

use super::Candidates;

#[derive(Debug, Clone, Default)]
pub struct RoundRobin {
    cursor: usize,
}

impl RoundRobin {
    pub fn pick(&mut self, c: &impl Candidates) -> Option<usize> {
        let n = c.len();
        for _ in 0..n {
            let i = self.cursor % n;
            self.cursor = self.cursor.wrapping_add(1);
            if c.weight(i) > 0 {
                return Some(i);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::lb::Fixed;

    #[test]
    fn cycles_evenly() {
        let mut rr = RoundRobin::default();
        let c = Fixed::new(&[1, 1, 1]);
        let picks: Vec<_> = (0..6).map(|_| rr.pick(&c).unwrap()).collect();
        assert_eq!(picks, vec![0, 1, 2, 0, 1, 2]);
        assert_eq!(rr.pick(&Fixed::new(&[])), None);
    }

    #[test]
    fn skips_unavailable_members() {
        let mut rr = RoundRobin::default();
        let c = Fixed::new(&[1, 0, 1]);
        let picks: Vec<_> = (0..4).map(|_| rr.pick(&c).unwrap()).collect();
        assert_eq!(picks, vec![0, 2, 0, 2]);
        assert_eq!(rr.pick(&Fixed::new(&[0, 0])), None);
    }
}
