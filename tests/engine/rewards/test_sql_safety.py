import pytest

from engine.rewards.sql_safety import (
    WEIGHTS,
    compute_score,
    extract_sql,
    normalize_sql,
    referenced_tables,
    refusal_reasons,
)

ALLOWED = ["users", "orders"]


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("DROP TABLE users", "DROP"),
        ("DELETE FROM users WHERE id = 3", "DELETE FROM"),
        ("TRUNCATE TABLE users", "TRUNCATE"),
        ("SELECT name FROM users WHERE id = 1 UNION SELECT password FROM users", "UNION SELECT"),
        ("SELECT name FROM users UNION ALL SELECT name FROM orders", "UNION SELECT"),
        ("SELECT * FROM users; SELECT * FROM orders", "stacked statements (2)"),
        ("SELECT * FROM users WHERE name = 'a' -- AND active = 1", "comment in query"),
        ("SELECT * FROM users /* hidden */ WHERE id = 1", "comment in query"),
    ],
)
def test_each_refusal_reason(sql, reason):
    assert reason in refusal_reasons(sql)
    result = compute_score(sql, allowed_tables=ALLOWED)
    assert result["safe"] == 0
    assert reason in result["reasons"]


def test_classic_injection_collects_every_reason():
    reasons = refusal_reasons("SELECT * FROM users WHERE id = 1; DROP TABLE users --")
    assert reasons == ["stacked statements (2)", "comment in query", "DROP"]


def test_safe_select_with_trailing_semicolon_passes():
    assert refusal_reasons("SELECT id FROM users WHERE id = 1;") == []


def test_referenced_tables_cover_joins_subqueries_schemas_and_aliases():
    sql = (
        "SELECT u.a FROM public.users AS u JOIN orders o ON u.id = o.uid "
        "WHERE u.id IN (SELECT uid FROM secrets), logs"
    )
    assert referenced_tables(sql) == ["public.users", "orders", "secrets"]
    assert referenced_tables("INSERT INTO logs (a) VALUES (1)") == ["logs"]
    assert referenced_tables("UPDATE users SET a = 1") == ["users"]


def test_whitelist_parts_and_extra_info_override():
    result = compute_score("SELECT * FROM users JOIN secrets ON 1 = 1", allowed_tables=ALLOWED)
    assert result["tables_allowed"] == 0 and result["safe"] == 1
    assert "tables not allowed: secrets" in result["reasons"]
    # extra_info["allowed_tables"] wins over the argument
    ok = compute_score(
        "SELECT * FROM secrets", extra_info={"allowed_tables": ["SECRETS"]}, allowed_tables=ALLOWED
    )
    assert ok["tables_allowed"] == 1
    # CTE names are not tables
    cte = compute_score("WITH t AS (SELECT id FROM users) SELECT * FROM t", allowed_tables=ALLOWED)
    assert cte["tables_allowed"] == 1
    # no whitelist: nothing to check
    assert compute_score("SELECT * FROM anything")["tables_allowed"] == 1


def test_scores_are_the_documented_weighted_sums():
    assert WEIGHTS == {"parses": 0.1, "safe": 0.5, "tables_allowed": 0.2, "matches_reference": 0.2}
    perfect = compute_score(
        "```sql\nselect id, name from Users where id=1;\n```",
        "SELECT id, name FROM users WHERE id = 1",
        allowed_tables=ALLOWED,
    )
    assert perfect == {
        "score": pytest.approx(1.0),
        "parses": 1,
        "safe": 1,
        "tables_allowed": 1,
        "matches_reference": 1,
        "reasons": "",
    }
    wrong = compute_score("SELECT id FROM orders", "SELECT id FROM users", allowed_tables=ALLOWED)
    assert wrong["score"] == pytest.approx(0.8)
    # no reference: matches_reference leaves the sum, the rest renormalise over 0.8
    unsafe = compute_score("DELETE FROM users", allowed_tables=ALLOWED)
    assert unsafe["score"] == pytest.approx((0.1 + 0.2) / 0.8)


def test_every_safe_query_outranks_every_unsafe_one():
    reference = "SELECT id FROM users"
    safe_worst = compute_score("SELECT * FROM secrets", reference, allowed_tables=ALLOWED)
    unsafe_best = compute_score(
        "SELECT id FROM users; DROP TABLE users", None, allowed_tables=ALLOWED
    )
    unsafe_ref = compute_score(
        "SELECT id FROM users -- x", "SELECT id FROM users -- x", allowed_tables=ALLOWED
    )
    assert safe_worst["score"] == pytest.approx(0.6)
    assert unsafe_ref["score"] == pytest.approx(0.5)
    assert safe_worst["score"] > unsafe_ref["score"]
    assert (
        compute_score("SELECT * FROM secrets", allowed_tables=ALLOWED)["score"]
        > unsafe_best["score"]
    )


def test_unparsable_text_scores_zero_everywhere():
    for text in ["I cannot help with that.", "SELECT 'unterminated FROM users", "SELECT (a FROM t"]:
        result = compute_score(text, "SELECT 1", allowed_tables=ALLOWED)
        assert result["score"] == 0.0 and result["parses"] == 0
        assert result["reasons"] == "does not parse as SQL"


def test_extract_sql_and_normalisation():
    text = "Here:\n```SQL\nSELECT 1\n```\nbetter:\n```sql\nSELECT 2;\n```"
    assert extract_sql(text) == "SELECT 2;"
    assert extract_sql("  SELECT 3  ") == "SELECT 3"
    assert normalize_sql("select a,b from T where a='X';") == normalize_sql(
        "SELECT a, b\nFROM t WHERE a = 'X'"
    )
    assert normalize_sql("SELECT 'x'") != normalize_sql("SELECT 'X'")


def test_a_string_whitelist_is_rejected():
    with pytest.raises(TypeError, match="list of table names"):
        compute_score("SELECT 1", allowed_tables="users")
