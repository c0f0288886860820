#[test]
fn dump() {
    let src = std::fs::read_to_string("infra/main.bicep").unwrap();
    let mut parser = tree_sitter::Parser::new();
    parser
        .set_language(&tree_sitter_bicep::LANGUAGE.into())
        .unwrap();
    let tree = parser.parse(&src, None).unwrap();
    println!("{}", tree.root_node().to_sexp());
    assert!(!tree.root_node().has_error());
}
