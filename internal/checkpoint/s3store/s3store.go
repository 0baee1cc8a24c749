// Package s3store keeps workspace checkpoints in an S3-compatible bucket (Amazon S3, MinIO, SeaweedFS,
// versitygw, Ceph RGW...): it implements internal/checkpoint's Store over the S3 REST API (PUT, GET and
// HEAD of objects, path-style URLs, Signature Version 4), on net/http alone.
package s3store

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"time"
)

// Config says where the bucket is and how to sign requests to it.
type Config struct {
	// Endpoint is the S3 service's base URL: https://s3.eu-west-1.amazonaws.com, http://minio:9000.
	Endpoint string
	// Bucket holds the checkpoints; it must exist.
	Bucket string
	// Region is the bucket's region, for the signature; default DefaultRegion.
	Region string
	// Prefix is put before every object name ("toolpool/"), so that a bucket can hold more than this.
	Prefix string
	// AccessKeyID and SecretAccessKey sign the requests.
	AccessKeyID, SecretAccessKey string
}

// DefaultRegion is the region of a Config that names none (what MinIO and most S3-compatible servers use).
const DefaultRegion = "us-east-1"

// MaxObjectBytes bounds one object Put: a checkpoint's chunks and trees are far smaller.
const MaxObjectBytes = 1 << 30

// Validate checks the configuration and says what to fix.
func (c *Config) Validate() error {
	u, err := url.Parse(c.Endpoint)
	switch {
	case c.Endpoint == "":
		return errors.New("s3 endpoint is empty: set the S3 service's URL (https://s3.REGION.amazonaws.com, http://minio:9000)")
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "":
		return fmt.Errorf("s3 endpoint %q must be an http:// or https:// URL with a host and no path", c.Endpoint)
	case c.Bucket == "" || strings.ContainsAny(c.Bucket, "/?#"):
		return fmt.Errorf("s3 bucket %q must be a bucket name", c.Bucket)
	case c.AccessKeyID == "" || c.SecretAccessKey == "":
		return errors.New("s3 access key id and secret access key must both be set")
	}
	return nil
}

// Store is an S3 bucket as a checkpoint store. Safe for concurrent use.
type Store struct {
	cfg    Config
	base   *url.URL
	client *http.Client
	now    func() time.Time
}

// defaultClient sends requests when New is given no client: a server that accepts a connection and then
// says nothing fails the request instead of holding it (a large object's body may still take long).
var defaultClient = &http.Client{Transport: &http.Transport{
	Proxy:                 http.ProxyFromEnvironment,
	DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
	TLSHandshakeTimeout:   10 * time.Second,
	ResponseHeaderTimeout: time.Minute,
	IdleConnTimeout:       90 * time.Second,
	MaxIdleConnsPerHost:   64,
}}

// New returns the Store of cfg, sending its requests with client (when nil, one whose connections and
// answers' headers time out).
func New(cfg Config, client *http.Client) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("new s3 store: %w", err)
	}
	if cfg.Region == "" {
		cfg.Region = DefaultRegion
	}
	if client == nil {
		client = defaultClient
	}
	base, _ := url.Parse(strings.TrimSuffix(cfg.Endpoint, "/"))
	return &Store{cfg: cfg, base: base, client: client, now: time.Now}, nil
}

// Put stores what r yields under name, replacing any object of that name.
func (s *Store) Put(ctx context.Context, name string, r io.Reader) error {
	b, err := io.ReadAll(io.LimitReader(r, MaxObjectBytes+1))
	if err != nil {
		return fmt.Errorf("store s3 object %s: %w", name, err)
	}
	if len(b) > MaxObjectBytes {
		return fmt.Errorf("store s3 object %s: larger than %d bytes", name, MaxObjectBytes)
	}
	resp, err := s.do(ctx, http.MethodPut, s.cfg.Bucket+"/"+s.cfg.Prefix+name, nil, b)
	if err != nil {
		return fmt.Errorf("store s3 object %s: %w", name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("store s3 object %s: %w", name, failure(resp))
	}
	return nil
}

// Open returns a reader of the object name, which the caller closes; an error wrapping os.ErrNotExist
// when there is none.
func (s *Store) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	resp, err := s.do(ctx, http.MethodGet, s.cfg.Bucket+"/"+s.cfg.Prefix+name, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("read s3 object %s: %w", name, err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
		return resp.Body, nil
	case http.StatusNotFound:
		resp.Body.Close()
		return nil, fmt.Errorf("read s3 object %s: %w", name, os.ErrNotExist)
	}
	defer resp.Body.Close()
	return nil, fmt.Errorf("read s3 object %s: %w", name, failure(resp))
}

// Has reports whether there is an object name.
func (s *Store) Has(ctx context.Context, name string) (bool, error) {
	_, _, ok, err := s.Stat(ctx, name)
	return ok, err
}

// Stat returns the object name's size and when it was last written (its Last-Modified, by the server's
// clock, to the second); ok is false when there is none.
func (s *Store) Stat(ctx context.Context, name string) (size int64, modified time.Time, ok bool, err error) {
	resp, err := s.do(ctx, http.MethodHead, s.cfg.Bucket+"/"+s.cfg.Prefix+name, nil, nil)
	if err != nil {
		return 0, time.Time{}, false, fmt.Errorf("look up s3 object %s: %w", name, err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return 0, time.Time{}, false, nil
	default:
		return 0, time.Time{}, false, fmt.Errorf("look up s3 object %s: %w", name, failure(resp))
	}
	modified, err = http.ParseTime(resp.Header.Get("Last-Modified"))
	if err != nil {
		return 0, time.Time{}, false, fmt.Errorf("look up s3 object %s: its Last-Modified %q: %w", name, resp.Header.Get("Last-Modified"), err)
	}
	return resp.ContentLength, modified, true, nil
}

// List calls fn with every object whose name begins with prefix (ListObjectsV2, a page of up to 1000
// at a time), its name without the store's Prefix.
func (s *Store) List(ctx context.Context, prefix string, fn func(name string, size int64, modified time.Time) error) error {
	token := ""
	for {
		q := url.Values{"list-type": {"2"}, "prefix": {s.cfg.Prefix + prefix}}
		if token != "" {
			q.Set("continuation-token", token)
		}
		resp, err := s.do(ctx, http.MethodGet, s.cfg.Bucket, q, nil)
		if err != nil {
			return fmt.Errorf("list s3 objects %s*: %w", prefix, err)
		}
		var page struct {
			IsTruncated bool   `xml:"IsTruncated"`
			Next        string `xml:"NextContinuationToken"`
			Contents    []struct {
				Key          string    `xml:"Key"`
				LastModified time.Time `xml:"LastModified"`
				Size         int64     `xml:"Size"`
			} `xml:"Contents"`
		}
		if resp.StatusCode != http.StatusOK {
			err = failure(resp)
		} else {
			err = xml.NewDecoder(resp.Body).Decode(&page)
		}
		resp.Body.Close()
		if err != nil {
			return fmt.Errorf("list s3 objects %s*: %w", prefix, err)
		}
		for _, o := range page.Contents {
			if err := fn(strings.TrimPrefix(o.Key, s.cfg.Prefix), o.Size, o.LastModified); err != nil {
				return err
			}
		}
		if !page.IsTruncated || page.Next == "" {
			return nil
		}
		token = page.Next
	}
}

// Delete removes the object name; one that is not there is not an error (S3 answers 204 either way).
func (s *Store) Delete(ctx context.Context, name string) error {
	resp, err := s.do(ctx, http.MethodDelete, s.cfg.Bucket+"/"+s.cfg.Prefix+name, nil, nil)
	if err != nil {
		return fmt.Errorf("delete s3 object %s: %w", name, err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusNoContent, http.StatusOK, http.StatusNotFound:
		return nil
	}
	return fmt.Errorf("delete s3 object %s: %w", name, failure(resp))
}

// Check reports whether the bucket is there and the credentials are accepted, with what to fix when not.
func (s *Store) Check(ctx context.Context) error {
	resp, err := s.do(ctx, http.MethodHead, s.cfg.Bucket, nil, nil)
	if err != nil {
		return fmt.Errorf("reach s3 bucket %s at %s: %w", s.cfg.Bucket, s.cfg.Endpoint, err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		return nil
	case http.StatusNotFound:
		return fmt.Errorf("s3 bucket %s does not exist at %s: create it, or name another", s.cfg.Bucket, s.cfg.Endpoint)
	case http.StatusForbidden:
		return fmt.Errorf("s3 bucket %s at %s refused the credentials of access key %s: check the key and the bucket's policy", s.cfg.Bucket, s.cfg.Endpoint, s.cfg.AccessKeyID)
	}
	return fmt.Errorf("check s3 bucket %s at %s: %w", s.cfg.Bucket, s.cfg.Endpoint, failure(resp))
}

// CreateBucket creates the bucket (for tests, and a first setup by hand); one that exists already and is
// this account's is not an error.
func (s *Store) CreateBucket(ctx context.Context) error {
	resp, err := s.do(ctx, http.MethodPut, s.cfg.Bucket, nil, nil)
	if err != nil {
		return fmt.Errorf("create s3 bucket %s: %w", s.cfg.Bucket, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		err := failure(resp)
		if strings.Contains(err.Error(), "BucketAlreadyOwnedByYou") {
			return nil
		}
		return fmt.Errorf("create s3 bucket %s: %w", s.cfg.Bucket, err)
	}
	return nil
}

// do sends a signed request for path (bucket/key, unescaped) and query with body.
func (s *Store) do(ctx context.Context, method, path string, query url.Values, body []byte) (*http.Response, error) {
	u := *s.base
	u.Path = "/" + path
	u.RawPath = "/" + escapePath(path)
	u.RawQuery = canonicalQuery(query)
	req, err := http.NewRequestWithContext(ctx, method, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.ContentLength = int64(len(body))
	if body == nil {
		req.Body, req.GetBody = http.NoBody, nil
	}
	s.sign(req, body)
	return s.client.Do(req)
}

// sign adds Signature Version 4 headers to req, whose payload is body.
func (s *Store) sign(req *http.Request, body []byte) {
	now := s.now().UTC()
	amzDate, day := now.Format("20060102T150405Z"), now.Format("20060102")
	payload := sha256.Sum256(body)
	payloadHash := hex.EncodeToString(payload[:])
	req.Header.Set("X-Amz-Date", amzDate)
	req.Header.Set("X-Amz-Content-Sha256", payloadHash)
	signed := "host;x-amz-content-sha256;x-amz-date"
	canonical := strings.Join([]string{
		req.Method,
		req.URL.EscapedPath(),
		req.URL.RawQuery, // canonicalQuery's
		"host:" + req.URL.Host,
		"x-amz-content-sha256:" + payloadHash,
		"x-amz-date:" + amzDate,
		"",
		signed,
		payloadHash,
	}, "\n")
	scope := day + "/" + s.cfg.Region + "/s3/aws4_request"
	sum := sha256.Sum256([]byte(canonical))
	toSign := "AWS4-HMAC-SHA256\n" + amzDate + "\n" + scope + "\n" + hex.EncodeToString(sum[:])
	key := []byte("AWS4" + s.cfg.SecretAccessKey)
	for _, part := range []string{day, s.cfg.Region, "s3", "aws4_request"} {
		key = hmacSHA256(key, part)
	}
	req.Header.Set("Authorization", fmt.Sprintf("AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s",
		s.cfg.AccessKeyID, scope, signed, hex.EncodeToString(hmacSHA256(key, toSign))))
}

func hmacSHA256(key []byte, data string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(data))
	return h.Sum(nil)
}

// canonicalQuery encodes query as Signature Version 4 signs it: sorted by name, every byte but the
// unreserved ones escaped ("/" too).
func canonicalQuery(query url.Values) string {
	keys := make([]string, 0, len(query))
	for k := range query {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		for _, v := range query[k] {
			parts = append(parts, escape(k, false)+"="+escape(v, false))
		}
	}
	return strings.Join(parts, "&")
}

// escapePath escapes path as S3 signs it: every byte but the unreserved ones and "/".
func escapePath(path string) string { return escape(path, true) }

// escape escapes every byte of s but the unreserved ones, and "/" when slash is set.
func escape(s string, slash bool) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || strings.IndexByte("-_.~", c) >= 0 || slash && c == '/' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// failure describes an S3 error answer: its status and the code and message of its XML body.
func failure(resp *http.Response) error {
	var e struct {
		Code    string `xml:"Code"`
		Message string `xml:"Message"`
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if xml.Unmarshal(body, &e) == nil && e.Code != "" {
		return fmt.Errorf("HTTP %d %s: %s", resp.StatusCode, e.Code, e.Message)
	}
	return fmt.Errorf("HTTP %d", resp.StatusCode)
}
