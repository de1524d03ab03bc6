/**
 * A tiny XML well-formedness check for the verifier's SVG (the repository has no XML parser, and
 * this needs none): one root element, balanced and properly nested tags, attributes quoted and
 * unique per element, no `<` or stray `&` in text or attribute values, only the five predefined
 * entities and numeric character references. Returns the problems (empty when well-formed) and
 * the elements seen, for assertions about the content.
 */
export interface XmlElement {
  name: string;
  attributes: Record<string, string>;
  /** Names of the enclosing elements, outermost first. */
  path: string[];
}

const NAME = '[A-Za-z_:][-A-Za-z0-9_:.]*';
const ENTITY = /&(?:amp|lt|gt|quot|apos|#[0-9]+|#x[0-9A-Fa-f]+);/g;

function badText(text: string): string | undefined {
  if (text.includes('<')) return 'a "<" in text';
  if (text.replace(ENTITY, '').includes('&')) return 'an "&" that is not an entity';
  return undefined;
}

export function checkXml(source: string): { problems: string[]; elements: XmlElement[] } {
  const problems: string[] = [];
  const elements: XmlElement[] = [];
  const stack: string[] = [];
  let roots = 0;
  let i = 0;
  const text = source.replace(/^\uFEFF/, '');
  if (text.startsWith('<?xml')) {
    const end = text.indexOf('?>');
    if (end < 0) return { problems: ['unterminated XML declaration'], elements };
    i = end + 2;
  }
  const tag = new RegExp(`^<(/?)(${NAME})((?:\\s+${NAME}\\s*=\\s*(?:"[^"]*"|'[^']*'))*)\\s*(/?)>`);
  const attribute = new RegExp(`(${NAME})\\s*=\\s*(?:"([^"]*)"|'([^']*)')`, 'g');
  while (i < text.length) {
    const lt = text.indexOf('<', i);
    const chunk = lt < 0 ? text.slice(i) : text.slice(i, lt);
    const bad = badText(chunk);
    if (bad) problems.push(`${bad} at offset ${i}`);
    if (stack.length === 0 && chunk.trim() !== '') problems.push(`text outside the root element at offset ${i}`);
    if (lt < 0) break;
    if (text.startsWith('<!--', lt)) {
      const end = text.indexOf('-->', lt);
      if (end < 0) {
        problems.push('unterminated comment');
        break;
      }
      i = end + 3;
      continue;
    }
    const m = tag.exec(text.slice(lt));
    if (!m) {
      problems.push(`malformed tag at offset ${lt}: ${JSON.stringify(text.slice(lt, lt + 60))}`);
      break;
    }
    const [whole, closing, name, attrs, selfClosing] = m as unknown as [string, string, string, string, string];
    if (closing) {
      if (attrs.trim() !== '' || selfClosing) problems.push(`closing tag </${name}> with attributes at offset ${lt}`);
      const open = stack.pop();
      if (open !== name) problems.push(`</${name}> at offset ${lt} closes <${open ?? 'nothing'}>`);
    } else {
      if (stack.length === 0) roots++;
      const attributes: Record<string, string> = {};
      for (const a of attrs.matchAll(attribute)) {
        const value = a[2] ?? a[3] ?? '';
        if (a[1]! in attributes) problems.push(`duplicate attribute ${a[1]} on <${name}> at offset ${lt}`);
        const badValue = badText(value);
        if (badValue) problems.push(`${badValue} in attribute ${a[1]} of <${name}> at offset ${lt}`);
        attributes[a[1]!] = value;
      }
      elements.push({ name, attributes, path: [...stack] });
      if (!selfClosing) stack.push(name);
    }
    i = lt + whole.length;
  }
  if (stack.length > 0) problems.push(`unclosed elements: ${stack.join(' > ')}`);
  if (roots !== 1) problems.push(`expected one root element, found ${roots}`);
  return { problems, elements };
}
