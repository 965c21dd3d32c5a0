//! The `calculator` tool: arithmetic over decimals, by a small recursive-descent parser.
//!
//! Written by hand so that every input a model can send is bounded (length, nesting) and every failure is a
//! message saying where, never a panic; `format` renders results the way a person writes them, so a task's
//! answer can be compared as text.

/// Expressions longer than this are refused (a model's arithmetic is short; random text need not be parsed).
pub const MAX_LEN: usize = 256;
/// Nesting (parentheses and unary minus) deeper than this is refused, which bounds the recursion.
pub const MAX_DEPTH: usize = 64;

/// The value of `expr`: numbers with optional decimals, `+ - * / %`, parentheses and unary minus, with the
/// usual precedence (`%` is the remainder with the dividend's sign, as for integers).
pub fn evaluate(expr: &str) -> Result<f64, String> {
    let n = expr.chars().count();
    if n > MAX_LEN {
        return Err(format!("expression is {n} characters long (at most {MAX_LEN})"));
    }
    let mut p = Parser { s: expr.as_bytes(), i: 0, depth: 0 };
    let x = p.expr()?;
    p.skip_space();
    if p.i < p.s.len() {
        return Err(p.unexpected());
    }
    if !x.is_finite() {
        return Err("the result is not a finite number".into());
    }
    Ok(x)
}

/// `x` as text: integers without a fractional part, anything else with at most 6 decimals, trailing zeros trimmed.
pub fn format(x: f64) -> String {
    let s = if x.fract() == 0.0 { format!("{x}") } else { format!("{x:.6}") };
    let s = if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s };
    if s == "-0" {
        "0".into()
    } else {
        s
    }
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    depth: usize,
}

impl Parser<'_> {
    fn skip_space(&mut self) {
        while self.s.get(self.i).is_some_and(|b| b.is_ascii_whitespace()) {
            self.i += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_space();
        self.s.get(self.i).copied()
    }

    /// Everything before `i` is ASCII (the parser only moves past ASCII), so `i + 1` is the character's position.
    fn unexpected(&self) -> String {
        match self.s.get(self.i) {
            None => "unexpected end of expression".into(),
            Some(_) => {
                let c = String::from_utf8_lossy(&self.s[self.i..]).chars().next().unwrap_or('?');
                format!("unexpected `{c}` at position {}", self.i + 1)
            }
        }
    }

    fn expr(&mut self) -> Result<f64, String> {
        let mut x = self.term()?;
        while let Some(op @ (b'+' | b'-')) = self.peek() {
            self.i += 1;
            let y = self.term()?;
            x = if op == b'+' { x + y } else { x - y };
        }
        Ok(x)
    }

    fn term(&mut self) -> Result<f64, String> {
        let mut x = self.unary()?;
        while let Some(op @ (b'*' | b'/' | b'%')) = self.peek() {
            let at = self.i + 1;
            self.i += 1;
            let y = self.unary()?;
            if op != b'*' && y == 0.0 {
                return Err(format!("division by zero at position {at}"));
            }
            x = match op {
                b'*' => x * y,
                b'/' => x / y,
                _ => x % y,
            };
        }
        Ok(x)
    }

    fn unary(&mut self) -> Result<f64, String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(format!("nesting deeper than {MAX_DEPTH} at position {}", self.i + 1));
        }
        let x = match self.peek() {
            Some(b'-') => {
                self.i += 1;
                self.unary().map(|x| -x)
            }
            Some(b'(') => {
                self.i += 1;
                let x = self.expr();
                match (x, self.peek()) {
                    (Ok(x), Some(b')')) => {
                        self.i += 1;
                        Ok(x)
                    }
                    (Ok(_), _) => Err(self.unexpected() + " (expected `)`)"),
                    (Err(e), _) => Err(e),
                }
            }
            Some(b'0'..=b'9' | b'.') => self.number(),
            _ => Err(self.unexpected()),
        };
        self.depth -= 1;
        x
    }

    fn number(&mut self) -> Result<f64, String> {
        let start = self.i;
        while self.s.get(self.i).is_some_and(|b| b.is_ascii_digit() || *b == b'.') {
            self.i += 1;
        }
        // Only ASCII digits and dots were consumed, so the slice is valid UTF-8.
        let text = std::str::from_utf8(&self.s[start..self.i]).unwrap_or("");
        text.parse::<f64>().map_err(|_| format!("bad number `{text}` at position {}", start + 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn eval(s: &str) -> String {
        evaluate(s).map(format).unwrap_or_else(|e| format!("error: {e}"))
    }

    #[test]
    fn arithmetic_with_precedence() {
        assert_eq!(eval("1 + 2 * 3"), "7");
        assert_eq!(eval("(1 + 2) * 3"), "9");
        assert_eq!(eval("-(2 - 5) % 2"), "1");
        assert_eq!(eval("-7 % 3"), "-1");
        assert_eq!(eval("10 / 4"), "2.5");
        assert_eq!(eval("1 / 3"), "0.333333");
        assert_eq!(eval("0.1 + 0.2"), "0.3");
        assert_eq!(eval(" 3 - - 2 "), "5");
        assert_eq!(eval("12345678 * 1000"), "12345678000");
    }

    #[test]
    fn errors_say_what_and_where() {
        assert!(eval("1 / 0").contains("division by zero at position 3"), "{}", eval("1 / 0"));
        assert!(eval("5 % (2 - 2)").contains("division by zero"));
        assert!(eval("1 + ").contains("end of expression"));
        assert!(eval("2 * x").contains("unexpected `x` at position 5"), "{}", eval("2 * x"));
        assert!(eval("(1 + 2").contains("expected `)`"));
        assert!(eval("1 2").contains("position 3"));
        assert!(eval("1.2.3").contains("bad number `1.2.3`"));
        assert!(eval("").contains("end of expression"));
        assert!(eval("2 ∗ 3").contains("unexpected `∗`"));
        let deep = format!("{}1{}", "(".repeat(65), ")".repeat(65));
        assert!(eval(&deep).contains("nesting deeper than 64"), "{}", eval(&deep));
        let ok = format!("{}1{}", "(".repeat(60), ")".repeat(60));
        assert_eq!(eval(&ok), "1");
        assert!(eval(&"1+".repeat(200)).contains("characters long"));
        // Within 256 characters and without exponents a result stays below 1e256, so the finiteness check is a
        // guard that cannot fire today; the largest such product is still a number.
        let huge = vec!["9".repeat(62); 4].join("*");
        assert!(evaluate(&huge).is_ok_and(f64::is_finite));
    }

    #[test]
    fn formatting() {
        assert_eq!(format(3.0), "3");
        assert_eq!(format(-0.0), "0");
        assert_eq!(format(2.5), "2.5");
        assert_eq!(format(-1e-9), "0");
        assert_eq!(format(1.0 / 7.0), "0.142857");
        assert_eq!(format(1e20), "100000000000000000000");
    }

    /// An integer expression and its i64 value (None when it divides by zero).
    #[derive(Debug, Clone)]
    enum Expr {
        Num(i64),
        Neg(Box<Expr>),
        Bin(Box<Expr>, char, Box<Expr>),
    }

    impl Expr {
        fn text(&self) -> String {
            match self {
                Expr::Num(n) => n.to_string(),
                Expr::Neg(e) => format!("-{}", e.text()),
                Expr::Bin(a, op, b) => format!("({} {op} {})", a.text(), b.text()),
            }
        }
        fn value(&self) -> Option<i64> {
            match self {
                Expr::Num(n) => Some(*n),
                Expr::Neg(e) => e.value().map(|v| -v),
                Expr::Bin(a, op, b) => {
                    let (a, b) = (a.value()?, b.value()?);
                    match op {
                        '+' => Some(a + b),
                        '-' => Some(a - b),
                        '*' => Some(a * b),
                        _ => a.checked_rem(b),
                    }
                }
            }
        }
    }

    fn expr() -> impl Strategy<Value = Expr> {
        (0i64..50).prop_map(Expr::Num).prop_recursive(3, 16, 2, |inner| {
            prop_oneof![
                inner.clone().prop_map(|e| Expr::Neg(Box::new(e))),
                (inner.clone(), prop_oneof![Just('+'), Just('-'), Just('*'), Just('%')], inner)
                    .prop_map(|(a, op, b)| Expr::Bin(Box::new(a), op, Box::new(b))),
            ]
        })
    }

    proptest! {
        #[test]
        fn integer_expressions_agree_with_i64(e in expr()) {
            let text = e.text();
            match e.value() {
                Some(v) => prop_assert_eq!(evaluate(&text).map(format), Ok(v.to_string()), "{}", text),
                None => prop_assert!(evaluate(&text).is_err(), "{}", text),
            }
        }
    }
}
