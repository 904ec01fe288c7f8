// celeval evaluates the admission policies `gpu-admission policy native` generates with the API server's own
// admission code (k8s.io/apiserver, the release of the e2e control plane), put together as its plugins put it
// together (their compilePolicy functions are not exported; this file follows them line by line):
//
//   - a ValidatingAdmissionPolicy: one composited compiler holding the variables; the matchConditions through
//     the webhook's matcher; the validations and messageExpressions compiled and evaluated as the plugin does,
//     each decision made as its validator makes it (`validate`, the message trimmed, the fallbacks);
//   - a MutatingAdmissionPolicy: the same compiler; the dispatcher's composition context (without it a
//     variable reads as "no such key"); each JSONPatch mutation through patch.NewJSONPatcher, in order, each
//     on the previous one's result.
//
// Every policy is also compiled in the stricter environment the API server checks a policy with when it is
// written (NewExpressions): an expression it would refuse is an error here too.
//
// stdin: {"policy": <ValidatingAdmissionPolicy or MutatingAdmissionPolicy>, "reviews": [{"operation": "CREATE",
// "namespace": "ns", "namespaceLabels": {}, "resource": {"group", "version", "resource"}, "object": {...},
// "oldObject": {...}}]}
// stdout: {"results": [{"matched": bool, "object": {...}, "validations": [{"passed": bool, "message": ""}],
// "refused": "", "error": ""}]}: `object` is the object as the policies saw it, after the mutations of a
// MutatingAdmissionPolicy; "refused" says why the API server would refuse the object before admission; a
// policy that does not compile is an "error" on every review. Without a policy, each object is only read as
// admission reads it. One request after another until EOF, one line of answer each. Exit 2 on unreadable input.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	celgo "github.com/google/cel-go/cel"
	celtypes "github.com/google/cel-go/common/types"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/mutating/patch"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/cel/environment"
)

type expr struct {
	Name       string `json:"name"`
	Expression string `json:"expression"`
}

type policy struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Variables       []expr `json:"variables"`
		MatchConditions []expr `json:"matchConditions"`
		Validations     []struct {
			Expression        string `json:"expression"`
			Message           string `json:"message"`
			MessageExpression string `json:"messageExpression"`
		} `json:"validations"`
		Mutations []struct {
			PatchType string `json:"patchType"`
			JSONPatch *struct {
				Expression string `json:"expression"`
			} `json:"jsonPatch"`
		} `json:"mutations"`
	} `json:"spec"`
}

type review struct {
	Operation       string                      `json:"operation"`
	Namespace       string                      `json:"namespace"`
	NamespaceLabels map[string]string           `json:"namespaceLabels"`
	Resource        schema.GroupVersionResource `json:"resource"`
	Object          json.RawMessage             `json:"object"`
	OldObject       json.RawMessage             `json:"oldObject"`
}

type validation struct {
	Passed  bool   `json:"passed"`
	Message string `json:"message"`
}

type result struct {
	Matched     bool           `json:"matched"`
	Object      map[string]any `json:"object,omitempty"`
	Validations []validation   `json:"validations,omitempty"`
	Refused     string         `json:"refused,omitempty"`
	Error       string         `json:"error,omitempty"`
}

// The expressions of a policy, typed as the plugins type them (k8s.io/apiserver's validating package, whose
// other 500 dependencies - informers, clients - would double the build).
type variable struct{ name, expression string }

func (v *variable) GetExpression() string      { return v.expression }
func (v *variable) ReturnTypes() []*celgo.Type { return []*celgo.Type{celgo.AnyType, celgo.DynType} }
func (v *variable) GetName() string            { return v.name }

type check struct{ expression, message string }

func (c *check) GetExpression() string      { return c.expression }
func (c *check) ReturnTypes() []*celgo.Type { return []*celgo.Type{celgo.BoolType} }

type messageExpression struct{ expression string }

func (m *messageExpression) GetExpression() string      { return m.expression }
func (m *messageExpression) ReturnTypes() []*celgo.Type { return []*celgo.Type{celgo.StringType} }

// fail: an evaluation error is reported, never turned into a skip or an admit by a failurePolicy.
var fail = func() *admissionregistrationv1.FailurePolicyType { f := admissionregistrationv1.Fail; return &f }()

// compiled is one policy as the API server's plugin holds it.
type compiled struct {
	compiler *plugincel.CompositedCompiler
	matcher  matchconditions.Matcher
	checks   plugincel.ConditionEvaluator // nil for a MutatingAdmissionPolicy
	messages plugincel.ConditionEvaluator
	patchers []patch.Patcher
}

func variables(p policy) []plugincel.NamedExpressionAccessor {
	out := make([]plugincel.NamedExpressionAccessor, len(p.Spec.Variables))
	for i, v := range p.Spec.Variables {
		out[i] = &variable{name: v.Name, expression: v.Expression}
	}
	return out
}

func matchConditions(p policy) []plugincel.ExpressionAccessor {
	out := make([]plugincel.ExpressionAccessor, len(p.Spec.MatchConditions))
	for i, m := range p.Spec.MatchConditions {
		out[i] = &matchconditions.MatchCondition{Name: m.Name, Expression: m.Expression}
	}
	return out
}

// validations: the checks, and the messageExpressions (nil where a validation has none, as the plugin's).
func validations(p policy) ([]plugincel.ExpressionAccessor, []plugincel.ExpressionAccessor) {
	checks := make([]plugincel.ExpressionAccessor, len(p.Spec.Validations))
	messages := make([]plugincel.ExpressionAccessor, len(p.Spec.Validations))
	for i, v := range p.Spec.Validations {
		checks[i] = &check{expression: v.Expression, message: v.Message}
		if v.MessageExpression != "" {
			messages[i] = &messageExpression{expression: v.MessageExpression}
		}
	}
	return checks, messages
}

func jsonPatches(p policy) ([]plugincel.ExpressionAccessor, error) {
	out := make([]plugincel.ExpressionAccessor, len(p.Spec.Mutations))
	for i, m := range p.Spec.Mutations {
		if m.PatchType != "JSONPatch" || m.JSONPatch == nil {
			return nil, fmt.Errorf("mutation %d: patchType %q is not evaluated here (only JSONPatch)", i, m.PatchType)
		}
		out[i] = &patch.JSONPatchCondition{Expression: m.JSONPatch.Expression}
	}
	return out, nil
}

// compile builds the policy in this environment mode, with the compilation errors it met.
func compile(p policy, mode environment.Type) (*compiled, []error, error) {
	compiler, err := plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
	if err != nil {
		return nil, nil, err
	}
	opts := plugincel.OptionalVariableDeclarations{HasAuthorizer: true}
	var errs []error
	for _, v := range variables(p) {
		if r := compiler.CompileAndStoreVariable(v, opts, mode); r.Error != nil {
			errs = append(errs, fmt.Errorf("variable %s: %w", v.GetName(), r.Error))
		}
	}
	match := compiler.CompileCondition(matchConditions(p), opts, mode)
	errs = append(errs, match.CompilationErrors()...)
	c := &compiled{compiler: compiler, matcher: matchconditions.NewMatcher(match, fail, "policy", "validate", p.Metadata.Name)}
	switch p.Kind {
	case "ValidatingAdmissionPolicy":
		checks, messages := validations(p)
		c.checks = compiler.CompileCondition(checks, opts, mode)
		// The plugin compiles messageExpressions without the authorizer.
		c.messages = compiler.CompileCondition(messages, plugincel.OptionalVariableDeclarations{}, mode)
		errs = append(errs, c.checks.CompilationErrors()...)
		errs = append(errs, c.messages.CompilationErrors()...)
	case "MutatingAdmissionPolicy":
		accessors, err := jsonPatches(p)
		if err != nil {
			return nil, nil, err
		}
		popts := opts
		popts.HasPatchTypes = true
		for _, a := range accessors {
			ev := compiler.CompileMutatingEvaluator(a, popts, mode)
			errs = append(errs, ev.CompilationErrors()...)
			c.patchers = append(c.patchers, patch.NewJSONPatcher(ev))
		}
	default:
		return nil, nil, fmt.Errorf("kind %q is not an admission policy", p.Kind)
	}
	return c, errs, nil
}

// The built-in kinds the policies match: the API server decodes them into their types before admission.
var builtin = func() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, batchv1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}()

// kubectl's default --validate=strict: an unknown or duplicate field refuses the request.
var strict = kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, builtin, builtin, kjson.SerializerOptions{Strict: true})

// refused is an object the API server refuses before any admission policy sees it.
type refused struct{ error }

// admit reads an object as the API server hands it to admission: a built-in kind decoded strictly into its
// type (the policies then see it as the typed object converts back: quantities as strings, empty fields
// left out); a custom resource unstructured (JSON numbers as int64 or float64), its metadata read as an
// ObjectMeta. Not reproduced: defaulting and the API server's validation (the e2e test has both).
func admit(raw json.RawMessage) (runtime.Object, error) {
	u := &unstructured.Unstructured{}
	if _, _, err := unstructured.UnstructuredJSONScheme.Decode(raw, nil, u); err != nil {
		return nil, refused{err}
	}
	if builtin.Recognizes(u.GroupVersionKind()) {
		obj, _, err := strict.Decode(raw, nil, nil)
		if err != nil {
			return nil, refused{err}
		}
		return obj, nil
	}
	if md, ok := u.Object["metadata"]; ok {
		b, err := json.Marshal(md)
		if err == nil {
			err = json.Unmarshal(b, &metav1.ObjectMeta{})
		}
		if err != nil {
			return nil, refused{fmt.Errorf("metadata: %w", err)}
		}
	}
	return u, nil
}

// asJSON is an object as the policies see it (admission.ConvertObjectToUnstructured for a typed one).
func asJSON(obj runtime.Object) (map[string]any, error) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		return u.Object, nil
	}
	return runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
}

func attributes(r review) (*admission.VersionedAttributes, error) {
	obj, err := admit(r.Object)
	if err != nil {
		return nil, err
	}
	gvk := obj.GetObjectKind().GroupVersionKind()
	var old runtime.Object // untyped nil: a typed nil pointer would read as an oldObject
	if len(r.OldObject) > 0 && string(r.OldObject) != "null" {
		if old, err = admit(r.OldObject); err != nil {
			return nil, fmt.Errorf("oldObject: %w", err)
		}
	}
	op := admission.Operation(r.Operation)
	if op == "" {
		op = admission.Create
	}
	name := ""
	if m, err := meta.Accessor(obj); err == nil {
		name = m.GetName()
	}
	attrs := admission.NewAttributesRecord(obj, old, gvk, r.Namespace, name, r.Resource, "", op,
		&metav1.CreateOptions{}, false, nil)
	return &admission.VersionedAttributes{Attributes: attrs, VersionedKind: gvk,
		VersionedObject: admission.NewLazyObject(obj), VersionedOldObject: admission.NewLazyObject(old)}, nil
}

// validate decides each validation as validating's validator.Validate does (k8s.io/apiserver v0.37.2,
// policy/validating/validator.go): the message is the messageExpression's string, trimmed, unless it is empty,
// too long or multi-line, then the static message, then "failed expression: ...".
func validate(ctx context.Context, c *compiled, r review, va *admission.VersionedAttributes, ns *corev1.Namespace) result {
	req := plugincel.CreateAdmissionRequest(va.Attributes, metav1.GroupVersionResource(r.Resource),
		metav1.GroupVersionKind(va.VersionedKind))
	ns = plugincel.CreateNamespaceObject(ns)
	evals, remaining, err := c.checks.ForInput(ctx, va, req, plugincel.OptionalVariableBindings{}, ns,
		celconfig.RuntimeCELCostBudget)
	if err != nil {
		return result{Matched: true, Error: "validations: " + err.Error()}
	}
	messages, _, msgErr := c.messages.ForInput(ctx, va, req, plugincel.OptionalVariableBindings{}, ns, remaining)
	out := result{Matched: true}
	for i, e := range evals {
		switch {
		case e.Error != nil:
			return result{Matched: true, Error: "validation: " + e.Error.Error()}
		case msgErr != nil:
			return result{Matched: true, Error: "failed messageExpression: " + msgErr.Error()}
		case e.EvalResult == celtypes.True:
			out.Validations = append(out.Validations, validation{Passed: true})
			continue
		}
		message := ""
		if i < len(messages) && messages[i].Error == nil && messages[i].EvalResult != nil {
			if m, ok := messages[i].EvalResult.Value().(string); ok {
				message = strings.TrimSpace(m)
				if len(message) > celconfig.MaxEvaluatedMessageExpressionSizeBytes || strings.Contains(message, "\n") {
					message = ""
				}
			}
		}
		if i < len(messages) && messages[i].Error != nil {
			// The API server only logs it; a test wants to know.
			return result{Matched: true, Error: "messageExpression: " + messages[i].Error.Error()}
		}
		ch, _ := e.ExpressionAccessor.(*check)
		if message == "" && ch != nil {
			message = strings.TrimSpace(ch.message)
		}
		if message == "" && ch != nil {
			message = "failed expression: " + strings.TrimSpace(ch.expression)
		}
		out.Validations = append(out.Validations, validation{Passed: false, Message: message})
	}
	return withObject(out, va)
}

func withObject(out result, va *admission.VersionedAttributes) result {
	obj, err := asJSON(va.VersionedObject.Object())
	if err != nil {
		return result{Matched: out.Matched, Error: "object: " + err.Error()}
	}
	out.Object = obj
	return out
}

func mutate(ctx context.Context, c *compiled, r review, va *admission.VersionedAttributes, ns *corev1.Namespace) result {
	oi := admission.NewObjectInterfacesFromScheme(builtin)
	for i, p := range c.patchers {
		got, err := p.Patch(ctx, patch.Request{MatchedResource: r.Resource, VersionedAttributes: va, ObjectInterfaces: oi,
			Namespace: ns}, celconfig.RuntimeCELCostBudget)
		if err != nil {
			return result{Matched: true, Error: fmt.Sprintf("mutation %d: %v", i, err)}
		}
		va.UpdateObject(got)
	}
	return withObject(result{Matched: true}, va)
}

func evaluate(c *compiled, r review) result {
	va, err := attributes(r)
	var no refused
	if errors.As(err, &no) {
		return result{Refused: no.Error()}
	}
	if err != nil {
		return result{Error: err.Error()}
	}
	if c == nil { // no policy: the object as admission sees it
		return withObject(result{}, va)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.Namespace, Labels: r.NamespaceLabels}}
	// One composition context per invocation, as the mutating dispatcher makes one (the validating path
	// makes its own in every ForInput).
	ctx := c.compiler.CreateContext(context.Background())
	m := c.matcher.Match(ctx, va, nil, nil)
	if m.Error != nil {
		return result{Error: "matchConditions: " + m.Error.Error()}
	}
	if !m.Matches {
		return result{Matched: false}
	}
	if c.checks != nil {
		return validate(ctx, c, r, va, ns)
	}
	return mutate(ctx, c, r, va, ns)
}

// prepared is a policy compiled once, or why it does not compile.
type prepared struct {
	c   *compiled
	err error
}

func prepare(p policy) prepared {
	_, errs, err := compile(p, environment.NewExpressions)
	var c *compiled
	if err == nil && len(errs) == 0 {
		c, errs, err = compile(p, environment.StoredExpressions)
	}
	if err == nil && len(errs) > 0 {
		err = errors.Join(errs...)
	}
	return prepared{c: c, err: err}
}

// main answers each request on stdin (one JSON value after another, until EOF) with one line on stdout, so a
// test session keeps one process; a policy is compiled once per process (a large one takes a second).
func main() {
	dec := json.NewDecoder(os.Stdin)
	enc := json.NewEncoder(os.Stdout)
	cache := map[string]prepared{}
	for {
		var in struct {
			Policy  json.RawMessage `json:"policy"`
			Reviews []review        `json:"reviews"`
		}
		if err := dec.Decode(&in); err == io.EOF {
			return
		} else if err != nil {
			fmt.Fprintln(os.Stderr, "celeval: unreadable input:", err)
			os.Exit(2)
		}
		var pol prepared
		if len(in.Policy) > 0 && string(in.Policy) != "null" {
			var p policy
			if err := json.Unmarshal(in.Policy, &p); err != nil {
				pol.err = err
			} else {
				// Keyed by what is compiled: the policies of two policy documents differ in their
				// annotations (the document's hash) more often than in their CEL.
				key, _ := json.Marshal([]any{p.Kind, p.Spec})
				cached, ok := cache[string(key)]
				if !ok {
					cached = prepare(p)
					cache[string(key)] = cached
				}
				pol = cached
			}
		}
		results := make([]result, len(in.Reviews))
		for i, r := range in.Reviews {
			if pol.err != nil {
				results[i] = result{Error: "compile: " + pol.err.Error()}
				continue
			}
			results[i] = evaluate(pol.c, r)
		}
		if err := enc.Encode(map[string]any{"results": results}); err != nil {
			fmt.Fprintln(os.Stderr, "celeval:", err)
			os.Exit(1)
		}
	}
}
